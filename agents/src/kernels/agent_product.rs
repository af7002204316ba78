//! A population's products, each agent's on its own rows and weights: a dense layer's
//! `x [P, B, in] * w [P, in, out]` and a data convolution's (im2col, then one product
//! per agent), as single ops with a direct backward. Through candle a population's
//! convolution was a gather, four reshapes and permutes and a batched product, and its
//! backward as many again; its dense product's backward two transposes and two
//! products. Weights are in the population's layout: `[P, in, out]`, a convolution's
//! `in` its patch (`c_in * k * k`).

use candle_core::{CustomOp2, Result, Shape, Tensor};

use super::conv::Dims;
use super::dense::{product, transposed, Order, View};
use super::{cpu_forward, with_values, Grads2};

/// `(P, B, in, out)` of a dense product of `x` `[P, B, ...]` and `w` `[P, in, out]`.
fn linear_dims(x: &Shape, w: &Shape) -> Result<(usize, usize, usize, usize)> {
    let (p, n_in, n_out) = w.dims3()?;
    let dims = x.dims();
    if dims.len() < 3 || dims[0] != p || x.elem_count() != p * dims[1] * n_in {
        candle_core::bail!("population product: input {x:?} does not fit weights {w:?}");
    }
    Ok((p, dims[1], n_in, n_out))
}

/// A dense layer's product over every agent.
struct AgentLinear;

impl CustomOp2 for AgentLinear {
    cpu_forward!("linear-per-agent", |op, x @ lx, w @ lw| {
        let (p, b, n_in, n_out) = linear_dims(lx.shape(), lw.shape())?;
        let mut y = Vec::with_capacity(p * b * n_out);
        for (xi, wi) in x.chunks_exact(b * n_in).zip(w.chunks_exact(n_in * n_out)) {
            let (xi, wi) = (
                View::row_major(xi, b, n_in),
                View::row_major(wi, n_in, n_out),
            );
            y.extend(product(Order::RowMajor, xi, wi));
        }
        Ok((y, Shape::from((p, b, n_out))))
    });

    fn bwd(&self, x: &Tensor, w: &Tensor, _y: &Tensor, dy: &Tensor) -> Grads2 {
        let (dw, dx) = linear_gradients(x, w, dy, x.track_op())?;
        Ok((dx, Some(dw)))
    }
}

/// `x * w` per agent: `[P, B, out]` for `x` `[P, B, ...]` (its trailing axes flattened)
/// and `w` `[P, in, out]`; on the CPU one op, elsewhere a batched product.
pub(crate) fn linear(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    if !x.device().is_cpu() {
        let x = if x.rank() > 3 {
            x.flatten_from(2)?
        } else {
            x.clone()
        };
        return x.matmul(w);
    }
    x.contiguous()?.apply_op2(&w.contiguous()?, AgentLinear)
}

/// The weight gradient `x^T dy` of [`linear`] per agent, and the input's `dy w^T`
/// (in `x`'s shape) when asked.
pub(crate) fn linear_gradients(
    x: &Tensor,
    w: &Tensor,
    dy: &Tensor,
    input_gradient: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    let (p, b, n_in, n_out) = linear_dims(x.shape(), w.shape())?;
    let (dw, dx) = with_values(&x.contiguous()?, |x| {
        with_values(&w.contiguous()?, |w| {
            with_values(&dy.contiguous()?, |dy| {
                let mut dw = Vec::with_capacity(p * n_in * n_out);
                let mut dx = Vec::with_capacity(if input_gradient { x.len() } else { 0 });
                for i in 0..p {
                    let xi = View::row_major(&x[i * b * n_in..], b, n_in);
                    let wi = View::row_major(&w[i * n_in * n_out..], n_in, n_out);
                    let gi = View::row_major(&dy[i * b * n_out..], b, n_out);
                    dw.extend(product(Order::RowMajor, xi.t(), gi));
                    if input_gradient {
                        dx.extend(product(Order::RowMajor, gi, wi.t()));
                    }
                }
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
    /// `(P, one agent's sizes)` of inputs `[P, B, c_in * h * w]` (or `[P, B, c_in, h, w]`) and weights `[P, patch,
    /// c_out]`.
    fn dims(&self, x: &Shape, w: &Shape) -> Result<(usize, Dims)> {
        let (p, patch, c_out) = w.dims3()?;
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
    /// CPU one op.
    pub(crate) fn apply(self, x: &Tensor, w: &Tensor) -> Result<Tensor> {
        x.contiguous()?.apply_op2(&w.contiguous()?, self)
    }

    /// The weight gradient `[P, patch, c_out]` from the output's gradient `dy`.
    pub(crate) fn weight_gradient(&self, x: &Tensor, w: &Tensor, dy: &Tensor) -> Result<Tensor> {
        let (p, d) = self.dims(x.shape(), w.shape())?;
        let dw = with_values(&x.contiguous()?, |x| {
            with_values(&dy.contiguous()?, |dy| {
                let mut dw = Vec::with_capacity(w.elem_count());
                let (xs, ys) = (x.len() / p, dy.len() / p);
                for i in 0..p {
                    let cols = d.im2col(&x[i * xs..(i + 1) * xs]);
                    let by_channel =
                        transposed(&dy[i * ys..], 1, d.batch(), d.c_out(), d.positions());
                    // dW [patch, c_out] = cols [patch, columns] * dy [columns, c_out]
                    let cols = View::row_major(&cols, d.patch(), d.columns());
                    let dy = View::row_major(&by_channel, d.c_out(), d.columns());
                    dw.extend(product(Order::RowMajor, cols, dy.t()));
                }
                Ok(dw)
            })
        })?;
        Tensor::from_vec(dw, w.shape(), w.device())
    }
}

impl CustomOp2 for AgentConv {
    cpu_forward!("data-conv2d-per-agent", |op, x @ lx, w @ lw| {
        let (p, d) = op.dims(lx.shape(), lw.shape())?;
        let (xs, ws) = (x.len() / p, w.len() / p);
        let mut y = Vec::with_capacity(p * d.batch() * d.c_out() * d.positions());
        for i in 0..p {
            let cols = d.im2col(&x[i * xs..(i + 1) * xs]);
            // [c_out, columns] = w^T [c_out, patch] * cols [patch, columns]
            let wi = View::row_major(&w[i * ws..(i + 1) * ws], d.patch(), d.c_out()).t();
            let cols = View::row_major(&cols, d.patch(), d.columns());
            let by_channel = product(Order::RowMajor, wi, cols);
            y.extend(transposed(
                &by_channel,
                1,
                d.c_out(),
                d.batch(),
                d.positions(),
            ));
        }
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
            let w = Var::from_tensor(&random(&mut rng, &[3, 8, 6])).unwrap();
            let weights = random(&mut rng, &[3, 5, 6]);
            let fused = linear(x.as_tensor(), w.as_tensor()).unwrap();
            let flat = x.as_tensor().flatten_from(2).unwrap();
            let reference = flat.matmul(w.as_tensor()).unwrap();
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
            let wv = Var::from_tensor(&random(&mut rng, &[p, c_in * k * k, c_out])).unwrap();
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
            let product = im2col.patches(&x).unwrap().matmul(wv.as_tensor()).unwrap();
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
                (p, c_in * k * k + 1, c_out),
                candle_core::DType::F32,
                &Device::Cpu,
            );
            assert!(conv.apply(&x, &wrong.unwrap()).is_err());
        }
    }
}
