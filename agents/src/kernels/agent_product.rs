//! A population's products, each agent's on its own rows and weights with the single
//! network's kernels (`kernels::linear`, `kernels::conv`): a dense layer's `x [P, B,
//! in] * w [P, out, in]^T` and a data convolution's (im2col, then one product per
//! agent), as single ops with a direct backward. Through candle a population's
//! convolution was a gather, four reshapes and permutes and a batched product, and its
//! backward as many again; its dense product's backward two transposes and two
//! products. Weights are in the single network's layout, per agent: `[P, out, in]`, a
//! convolution's `in` its patch (`c_in * k * k`).

use candle_core::{CustomOp2, Result, Shape, Tensor};

use super::conv::Dims;
use super::dense::written_by_agents;
use super::linear::LinearCore;
use super::per_agent::agent_run;
use super::product::Product;
use super::{cpu_forward, with_values, Grads2};

/// `(P, B, one agent's product)` of `x` `[P, B, ...]` and `w` `[P, out, in]`.
fn linear_dims(x: &Shape, w: &Shape) -> Result<(usize, usize, LinearCore)> {
    let (p, n_out, n_in) = w.dims3()?;
    let dims = x.dims();
    if dims.len() < 3 || dims[0] != p || x.elem_count() != p * dims[1] * n_in {
        candle_core::bail!("population product: input {x:?} does not fit weights {w:?}");
    }
    Ok((p, dims[1], LinearCore::new(dims[1], n_in, n_out)))
}

/// Runs `f` on each agent's run of `values` (`P` equal runs), concatenating the results.
fn per_agent(p: usize, values: &[&[f32]], mut f: impl FnMut(&[&[f32]]) -> Vec<f32>) -> Vec<f32> {
    let mut out = Vec::new();
    let mut runs = Vec::with_capacity(values.len());
    for i in 0..p {
        runs.clear();
        runs.extend(values.iter().map(|v| agent_run(v, p, i)));
        let one = f(&runs);
        if p == 1 {
            return one;
        }
        out.extend(one);
    }
    out
}

/// A dense layer's product over every agent.
struct AgentLinear;

impl CustomOp2 for AgentLinear {
    cpu_forward!("linear-per-agent", |op, x @ lx, w @ lw| {
        let (p, b, core) = linear_dims(lx.shape(), lw.shape())?;
        let n_out = lw.shape().dims()[1];
        // Each agent's product written into its run: no per-agent buffer and copy.
        let y = written_by_agents(p * b * n_out, p, |i, run| {
            core.forward_into(agent_run(x, p, i), agent_run(w, p, i), run)
        });
        Ok((y, Shape::from((p, b, n_out))))
    });

    fn bwd(&self, x: &Tensor, w: &Tensor, _y: &Tensor, dy: &Tensor) -> Grads2 {
        let (dw, dx) = linear_gradients(x, w, dy, x.track_op())?;
        Ok((dx, Some(dw)))
    }
}

/// `x w^T` per agent: `[P, B, out]` for `x` `[P, B, ...]` (its trailing axes flattened)
/// and `w` `[P, out, in]`; on the CPU one op, elsewhere a batched product.
pub(crate) fn linear(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    if !x.device().is_cpu() {
        let x = if x.rank() > 3 {
            x.flatten_from(2)?
        } else {
            x.clone()
        };
        return x.matmul(&w.t()?);
    }
    x.contiguous()?.apply_op2(&w.contiguous()?, AgentLinear)
}

/// The weight gradient `dy^T x` of [`linear`] per agent, and the input's `dy w` (in
/// `x`'s shape) when asked.
pub(crate) fn linear_gradients(
    x: &Tensor,
    w: &Tensor,
    dy: &Tensor,
    input_gradient: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    if !x.device().is_cpu() {
        // A device's batched products: `dy^T x` and `dy w`.
        let flat = if x.rank() > 3 {
            x.flatten_from(2)?
        } else {
            x.clone()
        };
        let dw = dy.transpose(1, 2)?.matmul(&flat)?;
        let dx = match input_gradient {
            true => Some(dy.matmul(w)?.reshape(x.shape())?),
            false => None,
        };
        return Ok((dw, dx));
    }
    let (p, _, core) = linear_dims(x.shape(), w.shape())?;
    let (dw, dx) = with_values(&x.contiguous()?, |x| {
        with_values(&w.contiguous()?, |w| {
            with_values(&dy.contiguous()?, |dy| {
                let dw = written_by_agents(w.len(), p, |i, dwi| {
                    core.weight_gradient_into(agent_run(x, p, i), agent_run(dy, p, i), dwi)
                });
                let dx = match input_gradient {
                    true => written_by_agents(x.len(), p, |i, dxi| {
                        core.input_gradient_into(agent_run(w, p, i), agent_run(dy, p, i), dxi)
                    }),
                    false => Vec::new(),
                };
                Ok((dw, dx))
            })
        })
    })?;
    let dw = Tensor::from_vec(dw, w.shape(), w.device())?;
    let dx = match input_gradient {
        true => Some(Tensor::from_vec(dx, x.shape(), x.device())?),
        false => None,
    };
    Ok((dw, dx))
}

/// A convolution of data (no gradient reaches its input) over every agent.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AgentConv {
    pub(crate) c_in: usize,
    pub(crate) h: usize,
    pub(crate) w: usize,
    pub(crate) k: usize,
    pub(crate) stride: usize,
}

impl AgentConv {
    /// `(P, one agent's sizes)` of inputs `[P, B, c_in * h * w]` (or `[P, B, c_in, h, w]`)
    /// and weights `[P, c_out, patch]`.
    fn dims(&self, x: &Shape, w: &Shape) -> Result<(usize, Dims)> {
        let (p, c_out, patch) = w.dims3()?;
        if x.rank() < 2 {
            candle_core::bail!("population convolution: input {x:?} has no batch axis");
        }
        let d = Dims::new(
            x.dims()[1],
            c_out,
            (self.c_in, self.h, self.w),
            self.k,
            self.stride,
        )?;
        let sample = self.c_in * self.h * self.w;
        if x.dims().len() < 3 || x.dims()[0] != p || x.elem_count() != p * d.batch() * sample {
            candle_core::bail!("population convolution: input {x:?} for weights {w:?}");
        }
        if patch != d.patch() {
            candle_core::bail!("population convolution: weights {w:?}, patch {}", d.patch());
        }
        Ok((p, d))
    }

    /// Feature maps `[P, B, c_out, positions]` of data `x` `[P, B, c_in * h * w]`; on the
    /// CPU one op in candle's graph, on a device the columns' product.
    pub(crate) fn apply(self, x: &Tensor, w: &Tensor) -> Result<Tensor> {
        if !x.device().is_cpu() {
            return self.columns(x, w)?.apply(w);
        }
        x.contiguous()?.apply_op2(&w.contiguous()?, self)
    }

    /// Each agent's batch of `x` as im2col columns, for one product with `w` and
    /// (kept by a training forward) the weight's gradient without unfolding `x` again.
    pub(crate) fn columns(&self, x: &Tensor, w: &Tensor) -> Result<Columns> {
        let (p, d) = self.dims(x.shape(), w.shape())?;
        let shape = (p, d.patch(), d.columns());
        #[cfg(feature = "cuda")]
        if x.device().is_cuda() {
            let cols = super::cuda::device::im2col(x, self.kernel_dims(&d))?;
            return Ok(Columns { cols, d });
        }
        let cols = with_values(&x.contiguous()?, |x| {
            Ok(per_agent(p, &[x], |v| d.im2col(v[0])))
        })?;
        let cols = Tensor::from_vec(cols, shape, x.device())?;
        Ok(Columns { cols, d })
    }

    /// The CUDA kernel's sizes of one agent's convolution.
    #[cfg(feature = "cuda")]
    fn kernel_dims(&self, d: &Dims) -> super::cuda::args::ConvDims {
        let out = |n: usize| ((n - self.k) / self.stride + 1) as i32;
        super::cuda::args::ConvDims {
            batch: d.batch() as i32,
            c_in: self.c_in as i32,
            h: self.h as i32,
            w: self.w as i32,
            k: self.k as i32,
            stride: self.stride as i32,
            oh: out(self.h),
            ow: out(self.w),
        }
    }

    /// The weight gradient `[P, c_out, patch]` from the output's gradient `dy`.
    pub(crate) fn weight_gradient(&self, x: &Tensor, w: &Tensor, dy: &Tensor) -> Result<Tensor> {
        self.columns(x, w)?.weight_gradient(w, dy)
    }
}

/// A population's data convolution unfolded: each agent's columns `[P, c_in * k * k, B *
/// positions]` (one row per kernel tap) and one agent's sizes.
pub(crate) struct Columns {
    cols: Tensor,
    d: Dims,
}

impl Columns {
    /// Feature maps `[P, B, c_out, positions]`: each agent's weights times its columns,
    /// outside candle's graph (a training forward keeps the columns for its backward).
    pub(crate) fn apply(&self, w: &Tensor) -> Result<Tensor> {
        let (p, d) = (self.cols.dim(0)?, &self.d);
        if !self.cols.device().is_cpu() {
            // One batched product, then each agent's maps channel-major.
            let y = w.contiguous()?.matmul(&self.cols)?;
            let y = y.reshape((p, d.c_out(), d.batch(), d.positions()))?;
            return y.transpose(1, 2)?.contiguous();
        }
        let y = with_values(&self.cols, |cols| {
            with_values(&w.contiguous()?, |w| {
                Ok(per_agent(p, &[cols, w], |v| d.forward(v[0], v[1])))
            })
        })?;
        Tensor::from_vec(y, (p, d.batch(), d.c_out(), d.positions()), w.device())
    }

    /// The weight gradient `[P, c_out, patch]` from the output's gradient `dy`.
    pub(crate) fn weight_gradient(&self, w: &Tensor, dy: &Tensor) -> Result<Tensor> {
        let (p, d) = (self.cols.dim(0)?, &self.d);
        if !self.cols.device().is_cpu() {
            // `dy` channel-major `[P, c_out, B * positions]` times the columns' transpose.
            let by_channel = dy.transpose(1, 2)?.contiguous()?;
            let by_channel = by_channel.reshape((p, d.c_out(), d.columns()))?;
            return by_channel.matmul(&self.cols.transpose(1, 2)?);
        }
        let dw = with_values(&self.cols, |cols| {
            with_values(&dy.contiguous()?, |dy| {
                Ok(per_agent(p, &[cols, dy], |v| {
                    d.backward(v[0], &[], v[1], false).0
                }))
            })
        })?;
        Tensor::from_vec(dw, w.shape(), w.device())
    }
}

impl CustomOp2 for AgentConv {
    cpu_forward!("data-conv2d-per-agent", |op, x @ lx, w @ lw| {
        let (p, d) = op.dims(lx.shape(), lw.shape())?;
        let y = per_agent(p, &[x, w], |v| d.forward(&d.im2col(v[0]), v[1]));
        Ok((y, Shape::from((p, d.batch(), d.c_out(), d.positions()))))
    });

    fn bwd(&self, x: &Tensor, w: &Tensor, _y: &Tensor, dy: &Tensor) -> Grads2 {
        if x.track_op() {
            candle_core::bail!("population convolution: its input is data, with no gradient");
        }
        Ok((None, Some(self.weight_gradient(x, w, dy)?)))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor, Var};

    use super::*;
    use crate::test_support::{gradients, max_relative, random, Normals};

    /// The dense product per agent equals candle's batched product, values and both
    /// gradients (by candle's backward and by the explicit one), from inputs `[P, B,
    /// in]` and from feature maps `[P, B, C, positions]`.
    #[test]
    fn the_population_linear_equals_the_batched_product() {
        let mut rng = Normals::new(21);
        for x_dims in [vec![3, 5, 8], vec![3, 5, 2, 4]] {
            let x = Var::from_tensor(&random(&mut rng, &x_dims)).unwrap();
            let w = Var::from_tensor(&random(&mut rng, &[3, 6, 8])).unwrap();
            let weights = random(&mut rng, &[3, 5, 6]);
            let fused = linear(x.as_tensor(), w.as_tensor()).unwrap();
            let flat = x.as_tensor().flatten_from(2).unwrap();
            let reference = flat.matmul(&w.as_tensor().t().unwrap()).unwrap();
            assert!(max_relative(&fused, &reference) < 1e-6, "{x_dims:?}");
            let (gf, gr) = (gradients(&fused, &weights), gradients(&reference, &weights));
            let (dw, dx) = linear_gradients(x.as_tensor(), w.as_tensor(), &weights, true).unwrap();
            let explicit = [(&x, dx.unwrap()), (&w, dw)];
            for (v, e) in explicit {
                let r = gr.get(v.as_tensor()).unwrap();
                assert!(
                    max_relative(gf.get(v.as_tensor()).unwrap(), r) < 1e-5,
                    "{x_dims:?}"
                );
                assert!(
                    max_relative(&e, r) < 1e-5,
                    "{x_dims:?}: explicit {:?}",
                    v.dims()
                );
            }
        }
    }

    /// The data convolution per agent equals the population's unfolding and batched
    /// product (`population::conv`), values and the weight's gradient, with strides 1
    /// and 2.
    #[test]
    fn the_population_convolution_equals_the_unfolded_product() {
        let mut rng = Normals::new(22);
        let (p, b, c_in, h, w, k, c_out) = (3, 4, 2, 6, 5, 3, 4);
        for stride in [1, 2] {
            let x = random(&mut rng, &[p, b, c_in * h * w]);
            let wv = Var::from_tensor(&random(&mut rng, &[p, c_out, c_in * k * k])).unwrap();
            let conv = AgentConv {
                c_in,
                h,
                w,
                k,
                stride,
            };
            let fused = conv.apply(&x, wv.as_tensor()).unwrap();
            let im2col =
                crate::population::conv::Im2col::new(c_in, (h, w), k, stride, &Device::Cpu);
            let im2col = im2col.unwrap();
            let w_t = wv.as_tensor().t().unwrap();
            let product = im2col.patches(&x).unwrap().matmul(&w_t).unwrap();
            let reference = im2col.channels_first(&product, b).unwrap();
            assert_eq!(fused.dims(), reference.dims());
            assert!(max_relative(&fused, &reference) < 1e-6, "stride {stride}");
            let weights = random(&mut rng, reference.dims());
            let (gf, gr) = (gradients(&fused, &weights), gradients(&reference, &weights));
            let r = gr.get(wv.as_tensor()).unwrap();
            let explicit = conv.weight_gradient(&x, wv.as_tensor(), &weights).unwrap();
            assert!(max_relative(gf.get(wv.as_tensor()).unwrap(), r) < 1e-5);
            assert!(max_relative(&explicit, r) < 1e-5, "stride {stride}");
            let wrong = Tensor::zeros(
                (p, c_out, c_in * k * k + 1),
                candle_core::DType::F32,
                &Device::Cpu,
            );
            assert!(conv.apply(&x, &wrong.unwrap()).is_err());
        }
    }
}
