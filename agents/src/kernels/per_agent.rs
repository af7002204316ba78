//! A method's fused CPU op in its population form: the single network's loops, run on
//! each agent's values in turn. Everything a population stacks has the agents on its
//! leading axis, so agent `i`'s pre-activations (`[B, units]`, or `[B, channels,
//! positions]` over feature maps) and parameters are each one contiguous run, laid out
//! exactly as a single network's. One op forward and one gradient per input backward,
//! whatever P, where candle's tensor ops took tens of each.

use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor};

use super::dense::f32_slice;
use super::{gradient_like, with_values, Grads2, Grads3};

/// A method's loops on one agent's host values: pre-activations `t` and `N` per-unit
/// parameters (a gain, and a shift where the method has one).
pub(crate) trait AgentKernel<const N: usize>: Send + Sync + 'static {
    /// The op's name in candle's graph.
    fn name(&self) -> &'static str;

    /// Agent `agent`'s output (a kernel may hold per-agent state: batch statistics).
    fn forward(&self, agent: usize, t: &[f32], params: [&[f32]; N]) -> Result<Vec<f32>>;

    /// The gradients with respect to `t` and each parameter, from the output `out` and
    /// its gradient `dy`.
    fn backward(
        &self,
        agent: usize,
        t: &[f32],
        params: [&[f32]; N],
        out: &[f32],
        dy: &[f32],
    ) -> Result<(Vec<f32>, [Vec<f32>; N])>;
}

/// An [`AgentKernel`] over every agent of a stacked input.
pub(crate) struct PerAgent<K> {
    pub kernel: K,
    pub agents: usize,
}

impl<K> PerAgent<K> {
    /// Agent `i`'s run of `values`, checked to divide evenly among the agents.
    fn run<'a>(&self, values: &'a [f32], i: usize) -> Result<&'a [f32]> {
        let p = self.agents.max(1);
        if values.is_empty() || !values.len().is_multiple_of(p) {
            candle_core::bail!(
                "per-agent op: {} values are not {p} agents' runs",
                values.len()
            );
        }
        let n = values.len() / p;
        Ok(&values[i * n..(i + 1) * n])
    }

    /// Agent `i`'s run of each parameter.
    fn runs<'a, const N: usize>(&self, params: [&'a [f32]; N], i: usize) -> Result<[&'a [f32]; N]> {
        let mut runs: [&[f32]; N] = [&[]; N];
        for (run, p) in runs.iter_mut().zip(params) {
            *run = self.run(p, i)?;
        }
        Ok(runs)
    }

    /// The kernel's forward on each agent, concatenated.
    fn forward_all<const N: usize>(&self, t: &[f32], params: [&[f32]; N]) -> Result<Vec<f32>>
    where
        K: AgentKernel<N>,
    {
        let mut out = Vec::with_capacity(t.len());
        for i in 0..self.agents {
            let mine = self.runs(params, i)?;
            out.extend(self.kernel.forward(i, self.run(t, i)?, mine)?);
        }
        Ok(out)
    }

    /// The kernel's backward on each agent: `dt` and each parameter's gradient,
    /// concatenated over the agents.
    fn backward_all<const N: usize>(
        &self,
        t: &[f32],
        params: [&[f32]; N],
        out: &[f32],
        dy: &[f32],
    ) -> Result<(Vec<f32>, [Vec<f32>; N])>
    where
        K: AgentKernel<N>,
    {
        let mut dt = Vec::with_capacity(t.len());
        let mut dparams: [Vec<f32>; N] = std::array::from_fn(|_| Vec::new());
        for i in 0..self.agents {
            let mine = self.runs(params, i)?;
            let (d, ds) = self.kernel.backward(
                i,
                self.run(t, i)?,
                mine,
                self.run(out, i)?,
                self.run(dy, i)?,
            )?;
            dt.extend(d);
            for (all, one) in dparams.iter_mut().zip(ds) {
                all.extend(one);
            }
        }
        Ok((dt, dparams))
    }
}

impl<K: AgentKernel<1>> PerAgent<K> {
    /// The op on stacked `t` and its gain, in candle's graph.
    pub(crate) fn forward1(self, t: &Tensor, a: &Tensor) -> Result<Tensor> {
        t.contiguous()?.apply_op2(&a.contiguous()?, self)
    }
}

impl<K: AgentKernel<2>> PerAgent<K> {
    /// The op on stacked `t`, its gain and its shift, in candle's graph.
    pub(crate) fn forward2(self, t: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        t.contiguous()?
            .apply_op3(&a.contiguous()?, &b.contiguous()?, self)
    }
}

impl<K: AgentKernel<1>> CustomOp2 for PerAgent<K> {
    fn name(&self) -> &'static str {
        self.kernel.name()
    }

    fn cpu_fwd(
        &self,
        t: &CpuStorage,
        lt: &Layout,
        a: &CpuStorage,
        la: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let out = self.forward_all(f32_slice(t, lt)?, [f32_slice(a, la)?])?;
        Ok((CpuStorage::F32(out), lt.shape().clone()))
    }

    fn bwd(&self, t: &Tensor, a: &Tensor, out: &Tensor, dy: &Tensor) -> Grads2 {
        let (dt, [da]) = with_values(t, |tv| {
            with_values(&a.contiguous()?, |av| {
                with_values(out, |ov| {
                    with_values(&dy.contiguous()?, |dv| self.backward_all(tv, [av], ov, dv))
                })
            })
        })?;
        Ok((gradient_like(dt, t)?, gradient_like(da, a)?))
    }
}

impl<K: AgentKernel<2>> CustomOp3 for PerAgent<K> {
    fn name(&self) -> &'static str {
        self.kernel.name()
    }

    fn cpu_fwd(
        &self,
        t: &CpuStorage,
        lt: &Layout,
        a: &CpuStorage,
        la: &Layout,
        b: &CpuStorage,
        lb: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let params = [f32_slice(a, la)?, f32_slice(b, lb)?];
        let out = self.forward_all(f32_slice(t, lt)?, params)?;
        Ok((CpuStorage::F32(out), lt.shape().clone()))
    }

    fn bwd(&self, t: &Tensor, a: &Tensor, b: &Tensor, out: &Tensor, dy: &Tensor) -> Grads3 {
        let (dt, [da, db]) = with_values(t, |tv| {
            with_values(&a.contiguous()?, |av| {
                with_values(&b.contiguous()?, |bv| {
                    with_values(out, |ov| {
                        with_values(&dy.contiguous()?, |dv| {
                            self.backward_all(tv, [av, bv], ov, dv)
                        })
                    })
                })
            })
        })?;
        Ok((
            gradient_like(dt, t)?,
            gradient_like(da, a)?,
            gradient_like(db, b)?,
        ))
    }
}
