//! A method's fused CPU op in its population form: the single network's loops, run on
//! each agent's values in turn. Everything a population stacks has the agents on its
//! leading axis, so agent `i`'s pre-activations (`[B, units]`, or `[B, channels,
//! positions]` over feature maps) and parameters are each one contiguous run, laid out
//! exactly as a single network's. One op forward and one gradient per input backward,
//! whatever P, where candle's tensor ops took tens of each.

use std::sync::Arc;

use candle_core::backprop::GradStore;
use candle_core::{CustomOp2, CustomOp3, Result, Tensor, TensorId};

use super::{cpu_forward, with_values, Grads2, Grads3};

/// An op's inputs: pre-activations `t` and `N` per-unit parameters (a gain, and a
/// shift where the method has one); one agent's host values (`T = [f32]`, `agent` its
/// index) or every agent's on a device (`T = Tensor`, `agent` how many are stacked).
pub(crate) struct OpInputs<'a, T: ?Sized, const N: usize> {
    pub agent: usize,
    pub t: &'a T,
    pub params: [&'a T; N],
}

/// What an op's backward reads: its inputs, its output `out`, what a device forward
/// kept for it (a normalization's statistics; `None` on the host) and the output's
/// gradient `dy`.
pub(crate) struct OpGradient<'a, T: ?Sized, const N: usize> {
    pub inputs: OpInputs<'a, T, N>,
    pub out: &'a T,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub kept: Option<&'a T>,
    pub dy: &'a T,
}

// By hand, not derived: a derive would ask `T: Copy`, and `[f32]` is not sized.
impl<T: ?Sized, const N: usize> Clone for OpInputs<'_, T, N> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T: ?Sized, const N: usize> Copy for OpInputs<'_, T, N> {}
impl<T: ?Sized, const N: usize> Clone for OpGradient<'_, T, N> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T: ?Sized, const N: usize> Copy for OpGradient<'_, T, N> {}

impl<'a, T: ?Sized, const N: usize> OpGradient<'a, T, N> {
    /// `(t, params, out, dy)`.
    pub(crate) fn parts(&self) -> (&'a T, [&'a T; N], &'a T, &'a T) {
        (self.inputs.t, self.inputs.params, self.out, self.dy)
    }
}

impl<'a, const N: usize> OpGradient<'a, [f32], N> {
    /// Agent `agent`'s host values.
    pub(crate) fn host(
        agent: usize,
        (t, params): (&'a [f32], [&'a [f32]; N]),
        out: &'a [f32],
        dy: &'a [f32],
    ) -> Self {
        let inputs = OpInputs { agent, t, params };
        Self {
            inputs,
            out,
            kept: None,
            dy,
        }
    }
}

/// A device op's output and what its backward keeps, or `None` where the method has
/// no device kernel.
#[cfg(feature = "cuda")]
pub(crate) type DeviceOutput = Result<Option<(Tensor, Option<Tensor>)>>;

/// A method's loops on one agent's host values ([`OpInputs`]).
pub(crate) trait AgentKernel<const N: usize>: Send + Sync + 'static {
    /// The op's name in candle's graph.
    fn name(&self) -> &'static str;

    /// Agent `agent`'s output (a kernel may hold per-agent state: batch statistics).
    fn forward(&self, agent: usize, t: &[f32], params: [&[f32]; N]) -> Result<Vec<f32>>;

    /// The gradients with respect to `t` and each parameter, from the output `out` and
    /// its gradient `dy`.
    fn backward(&self, g: OpGradient<'_, [f32], N>) -> Result<(Vec<f32>, [Vec<f32>; N])>;

    /// [`Self::forward`] appended to `out`, where a population stacks each agent's
    /// (a kernel that can write there saves the copy).
    fn forward_extend(
        &self,
        agent: usize,
        t: &[f32],
        params: [&[f32]; N],
        out: &mut Vec<f32>,
    ) -> Result<()> {
        out.extend(self.forward(agent, t, params)?);
        Ok(())
    }

    /// [`Self::backward`] with the gradient of `t` appended to `dt`.
    fn backward_extend(
        &self,
        g: OpGradient<'_, [f32], N>,
        dt: &mut Vec<f32>,
    ) -> Result<[Vec<f32>; N]> {
        let (d, dparams) = self.backward(g)?;
        dt.extend(d);
        Ok(dparams)
    }

    /// The op on every agent's values at once on a CUDA device (`kernels/cuda`), with
    /// what its backward keeps (a normalization's statistics); `None` where the method
    /// has no CUDA kernel.
    #[cfg(feature = "cuda")]
    fn cuda_forward(&self, _: OpInputs<'_, Tensor, N>) -> DeviceOutput {
        Ok(None)
    }

    /// [`Self::cuda_forward`]'s gradients with respect to `t` and each parameter, from
    /// its output `out`, what it kept and the output's gradient `dy`.
    #[cfg(feature = "cuda")]
    fn cuda_gradients(&self, _: OpGradient<'_, Tensor, N>) -> Result<(Tensor, [Tensor; N])> {
        candle_core::bail!("{}: no CUDA kernel", self.name())
    }
}

/// Agent `i`'s run of `values`, which holds `p` equal runs (a stacked tensor's values:
/// the agents lead).
pub(crate) fn agent_run(values: &[f32], p: usize, i: usize) -> &[f32] {
    let n = values.len() / p.max(1);
    &values[i * n..(i + 1) * n]
}

/// An [`AgentKernel`] over every agent of a stacked input.
pub(crate) struct PerAgent<K> {
    pub kernel: K,
    pub agents: usize,
}

impl<K> PerAgent<K> {
    /// `kernel` over `agents` agents.
    pub(crate) fn new(kernel: K, agents: usize) -> Self {
        Self { kernel, agents }
    }

    /// Agent `i`'s run of `values`, checked to divide evenly among the agents.
    fn run<'a>(&self, values: &'a [f32], i: usize) -> Result<&'a [f32]> {
        let p = self.agents.max(1);
        if values.is_empty() || !values.len().is_multiple_of(p) {
            candle_core::bail!(
                "per-agent op: {} values are not {p} agents' runs",
                values.len()
            );
        }
        Ok(agent_run(values, p, i))
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
        if self.agents == 1 {
            // One agent (a CPU shard of one): its output is the op's, with no copy.
            return self
                .kernel
                .forward(0, self.run(t, 0)?, self.runs(params, 0)?);
        }
        let mut out = Vec::with_capacity(t.len());
        for i in 0..self.agents {
            let mine = self.runs(params, i)?;
            self.kernel
                .forward_extend(i, self.run(t, i)?, mine, &mut out)?;
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
        if self.agents == 1 {
            let (t, params) = (self.run(t, 0)?, self.runs(params, 0)?);
            let g = OpGradient::host(0, (t, params), self.run(out, 0)?, self.run(dy, 0)?);
            return self.kernel.backward(g);
        }
        let mut dt = Vec::with_capacity(t.len());
        let mut dparams: [Vec<f32>; N] = std::array::from_fn(|_| Vec::new());
        for i in 0..self.agents {
            let inputs = (self.run(t, i)?, self.runs(params, i)?);
            let (out, dy) = (self.run(out, i)?, self.run(dy, i)?);
            let ds = self
                .kernel
                .backward_extend(OpGradient::host(i, inputs, out, dy), &mut dt)?;
            for (all, one) in dparams.iter_mut().zip(ds) {
                all.extend(one);
            }
        }
        Ok((dt, dparams))
    }
}

/// An applied op's backward: from its output and the output's gradient, the input's
/// and each parameter's gradients.
type BackwardFn = dyn Fn(&Tensor, &Tensor) -> Result<(Tensor, Vec<Tensor>)> + Send + Sync;

/// A fused op's output with what its explicit backward needs: the op itself (which may
/// hold the forward's per-agent statistics) and its inputs. A population's update on
/// the CPU walks these back itself, where candle's backward would add every gradient
/// into a fresh zero tensor and go through every view.
pub(crate) struct Applied {
    pub(crate) out: Tensor,
    /// The parameters' ids, under which their gradients go.
    params: Vec<TensorId>,
    backward: Box<BackwardFn>,
}

impl Applied {
    /// The gradient with respect to the op's input, from the output's gradient `dy`;
    /// each parameter's is added to `grads`.
    pub(crate) fn backward(&self, dy: &Tensor, grads: &mut GradStore) -> Result<Tensor> {
        let (dt, dparams) = (self.backward)(&self.out, dy)?;
        for (&id, d) in self.params.iter().zip(dparams) {
            accumulate(grads, id, d)?;
        }
        Ok(dt)
    }
}

/// `grads[id] += g`.
pub(crate) fn accumulate(grads: &mut GradStore, id: TensorId, g: Tensor) -> Result<()> {
    if let Some(earlier) = grads.insert_id(id, g) {
        let sum = match grads.get_id(id) {
            Some(g) => (g + earlier)?,
            None => earlier,
        };
        grads.insert_id(id, sum);
    }
    Ok(())
}

/// Hands an op shared with its [`Applied`] to candle's graph.
struct Shared<K>(Arc<PerAgent<K>>);

impl<K: Send + Sync + 'static> PerAgent<K> {
    /// The op on stacked `t` and its `N` per-unit parameters, as candle's op and as an
    /// [`Applied`].
    fn apply<const N: usize>(self, t: &Tensor, params: [&Tensor; N]) -> Result<Applied>
    where
        K: AgentKernel<N>,
        Shared<K>: ApplyN<N>,
    {
        #[cfg(feature = "cuda")]
        if t.device().is_cuda() {
            return self.apply_on_cuda(t, params);
        }
        let t = t.contiguous()?;
        let ids = params.iter().map(|p| p.id()).collect();
        let params = params.map(|p| p.contiguous()).into_iter();
        let params: Vec<Tensor> = params.collect::<Result<_>>()?;
        let op = Arc::new(self);
        let out = Shared(op.clone()).apply_to(&t, &params)?;
        let backward = move |out: &Tensor, dy: &Tensor| {
            let refs: [&Tensor; N] = std::array::from_fn(|i| &params[i]);
            let (dt, dps) = op.gradients(&t, refs, out, dy)?;
            Ok((dt, dps.into_iter().collect()))
        };
        Ok(Applied {
            out,
            params: ids,
            backward: Box::new(backward),
        })
    }

    /// [`Self::apply`] on a CUDA device: the kernel's launches, kept for the explicit
    /// backward (no node in candle's graph: a device runs the fused ops in forwards
    /// without a gradient and under the explicit backward, never in the forward that
    /// candle's backward takes, `PopulationNet::forward_in_graph`).
    #[cfg(feature = "cuda")]
    fn apply_on_cuda<const N: usize>(self, t: &Tensor, params: [&Tensor; N]) -> Result<Applied>
    where
        K: AgentKernel<N>,
    {
        let t = t.contiguous()?;
        let ids = params.iter().map(|p| p.id()).collect();
        let params: Vec<Tensor> = params
            .iter()
            .map(|p| p.contiguous())
            .collect::<Result<_>>()?;
        let refs: [&Tensor; N] = std::array::from_fn(|i| &params[i]);
        let agent = self.agents;
        let Some((out, saved)) = self.kernel.cuda_forward(OpInputs {
            agent,
            t: &t,
            params: refs,
        })?
        else {
            candle_core::bail!("{}: no CUDA kernel", self.kernel.name());
        };
        let backward = move |out: &Tensor, dy: &Tensor| {
            let params: [&Tensor; N] = std::array::from_fn(|i| &params[i]);
            let inputs = OpInputs {
                agent,
                t: &t,
                params,
            };
            let kept = saved.as_ref();
            let (dt, dps) = self.kernel.cuda_gradients(OpGradient {
                inputs,
                out,
                kept,
                dy,
            })?;
            Ok((dt, dps.into_iter().collect()))
        };
        Ok(Applied {
            out,
            params: ids,
            backward: Box::new(backward),
        })
    }

    /// The gradients with respect to `t` and each parameter, as tensors.
    fn gradients<const N: usize>(
        &self,
        t: &Tensor,
        params: [&Tensor; N],
        out: &Tensor,
        dy: &Tensor,
    ) -> Result<(Tensor, [Tensor; N])>
    where
        K: AgentKernel<N>,
    {
        // The per-unit parameters are small: copied, so that only the large operands
        // are read in place.
        let owned = params
            .iter()
            .map(|p| with_values(&p.contiguous()?, |v| Ok(v.to_vec())))
            .collect::<Result<Vec<_>>>()?;
        let values: [&[f32]; N] = std::array::from_fn(|i| owned[i].as_slice());
        let (dt, dps) = with_values(t, |tv| {
            with_values(out, |ov| {
                with_values(&dy.contiguous()?, |dv| {
                    self.backward_all(tv, values, ov, dv)
                })
            })
        })?;
        let dt = Tensor::from_vec(dt, t.shape(), t.device())?;
        let mut grads = Vec::with_capacity(N);
        for (d, p) in dps.into_iter().zip(params) {
            grads.push(Tensor::from_vec(d, p.shape(), p.device())?);
        }
        let grads: [Tensor; N] = grads.try_into().map_err(|_| {
            candle_core::Error::Msg("per-agent op: a gradient per parameter".into())
        })?;
        Ok((dt, grads))
    }
}

impl<K: AgentKernel<1>> PerAgent<K> {
    /// The op on stacked `t` and its gain, in candle's graph, kept for an explicit
    /// backward.
    pub(crate) fn apply1(self, t: &Tensor, a: &Tensor) -> Result<Applied> {
        self.apply(t, [a])
    }
}

impl<K: AgentKernel<2>> PerAgent<K> {
    /// The op on stacked `t`, its gain and its shift, in candle's graph, kept for an
    /// explicit backward.
    pub(crate) fn apply2(self, t: &Tensor, a: &Tensor, b: &Tensor) -> Result<Applied> {
        self.apply(t, [a, b])
    }
}

/// Applies a shared op of `N` parameters in candle's graph.
trait ApplyN<const N: usize> {
    fn apply_to(self, t: &Tensor, params: &[Tensor]) -> Result<Tensor>;
}

impl<K: AgentKernel<1>> ApplyN<1> for Shared<K> {
    fn apply_to(self, t: &Tensor, params: &[Tensor]) -> Result<Tensor> {
        t.apply_op2(&params[0], self)
    }
}

impl<K: AgentKernel<2>> ApplyN<2> for Shared<K> {
    fn apply_to(self, t: &Tensor, params: &[Tensor]) -> Result<Tensor> {
        t.apply_op3(&params[0], &params[1], self)
    }
}

impl<K: AgentKernel<1>> CustomOp2 for Shared<K> {
    cpu_forward!(|op| op.0.kernel.name(), |op, t @ lt, a @ la| {
        Ok((op.0.forward_all(t, [a])?, lt.shape().clone()))
    });

    fn bwd(&self, t: &Tensor, a: &Tensor, out: &Tensor, dy: &Tensor) -> Grads2 {
        let (dt, [da]) = self.0.gradients(t, [a], out, dy)?;
        Ok((Some(dt), Some(da)))
    }
}

impl<K: AgentKernel<2>> CustomOp3 for Shared<K> {
    cpu_forward!(|op| op.0.kernel.name(), |op, t @ lt, a @ la, b @ lb| {
        Ok((op.0.forward_all(t, [a, b])?, lt.shape().clone()))
    });

    fn bwd(&self, t: &Tensor, a: &Tensor, b: &Tensor, out: &Tensor, dy: &Tensor) -> Grads3 {
        let (dt, [da, db]) = self.0.gradients(t, [a, b], out, dy)?;
        Ok((Some(dt), Some(da), Some(db)))
    }
}
