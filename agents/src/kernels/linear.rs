//! `y = x W^T` for Linear layers on the CPU as one op with a direct backward:
//! `dx = dy W` (skipped when `x` is data) and `dW = dy^T x`, both written contiguously.
//! Through candle's `matmul(w.t())` the weight gradient arrives transposed and is
//! accumulated by a strided add, which dominated small updates.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use normrl_agents::nn::LinearMap;
//!
//! let fc = LinearMap::Linear { n_in: 2, n_out: 1 };
//! let x = Tensor::new(&[[1.0f32, 2.0]], &Device::Cpu).unwrap();
//! let w = Tensor::new(&[[3.0f32, 4.0]], &Device::Cpu).unwrap();
//! assert_eq!(fc.apply(&x, &w).unwrap().to_vec2::<f32>().unwrap(), vec![vec![11.0]]);
//! ```

use candle_core::{CustomOp2, Result, Shape, Tensor};
use std::mem::MaybeUninit;

use super::dense::{product, product_into, transposed, Order, View};
use super::product::Product;
use super::with_values;
use super::{cpu_forward, gradient_like, Grads2};

pub(crate) struct LinearOp;

/// `(batch, features)` of an input `[B, ...]`: a conv output feeds a Linear layer
/// without a flatten (a graph node whose gradient candle zero-fills and adds).
fn rows(x: &Shape) -> Result<(usize, usize)> {
    match x.dims() {
        [] | [_] => candle_core::bail!("linear: input {x:?} has no batch dimension"),
        [b, ..] => Ok((*b, x.elem_count() / (*b).max(1))),
    }
}

/// The sizes of one linear product: `x [b, n_in] -> y [b, n_out]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LinearCore {
    b: usize,
    n_in: usize,
    n_out: usize,
}

impl LinearCore {
    /// `x [b, n_in] -> y [b, n_out]`.
    pub(crate) fn new(b: usize, n_in: usize, n_out: usize) -> Self {
        Self { b, n_in, n_out }
    }

    pub(crate) fn of(x: &Shape, w: &Shape) -> Result<Self> {
        let (b, n_in) = rows(x)?;
        let (n_out, w_in) = w.dims2()?;
        if w_in != n_in {
            candle_core::bail!("linear: input {x:?} does not fit weight {w:?}");
        }
        Ok(Self { b, n_in, n_out })
    }
}

impl Product for LinearCore {
    fn out_shape(&self) -> Shape {
        Shape::from((self.b, self.n_out))
    }

    fn forward(&self, x: &[f32], w: &[f32]) -> Vec<f32> {
        let (b, n_in, n_out) = (self.b, self.n_in, self.n_out);
        if let Some(y) = super::few_rows::forward(x, w, b, n_in, n_out) {
            return y;
        }
        let (x, w) = (View::row_major(x, b, n_in), View::row_major(w, n_out, n_in));
        // y [b, out] = x [b, in] * W^T [in, out]. Written row-major, gemm packs
        // (gathers) all of W; written column-major it packs x instead, and y then needs
        // a transpose. That pays for large weights and small batches.
        match self.packs_the_batch() {
            true => transposed(&product(Order::ColMajor, x, w.t()), 1, n_out, b, 1),
            false => product(Order::RowMajor, x, w.t()),
        }
    }

    fn backward(
        &self,
        x: &[f32],
        w: &[f32],
        dy: &[f32],
        input_gradient: bool,
    ) -> (Vec<f32>, Option<Vec<f32>>) {
        let (b, n_in, n_out) = (self.b, self.n_in, self.n_out);
        let xv = View::row_major(x, b, n_in);
        let wv = View::row_major(w, n_out, n_in);
        let gv = View::row_major(dy, b, n_out);
        // dW [out, in] = dy^T [out, b] * x [b, in]; dx [b, in] = dy [b, out] * W [out, in]
        let dw = product(Order::RowMajor, gv.t(), xv);
        let dx = input_gradient.then(|| product(Order::RowMajor, gv, wv));
        (dw, dx)
    }
}

impl LinearCore {
    /// Whether the product is written column-major, so that gemm packs the batch
    /// rather than the weights (large weights, small batches).
    fn packs_the_batch(&self) -> bool {
        self.b < self.n_out && self.n_out * self.n_in >= 1 << 14
    }

    /// [`Product::forward`] written into `y` (`[b, out]`, every value; it may start
    /// uninitialized): a population's agent into its run of the stacked output.
    pub(crate) fn forward_into(&self, x: &[f32], w: &[f32], y: &mut [MaybeUninit<f32>]) {
        // As `forward` chooses, so that a population's agent rounds as it would alone.
        if self.packs_the_batch() || super::few_rows::serves(self.b, self.n_in) {
            let t = self.forward(x, w);
            for (d, &v) in y.iter_mut().zip(&t) {
                d.write(v);
            }
            return;
        }
        let (x, w) = (
            View::row_major(x, self.b, self.n_in),
            View::row_major(w, self.n_out, self.n_in),
        );
        product_into(Order::RowMajor, x, w.t(), y);
    }

    /// The weight's gradient `dy^T x` written into `dw` (`[out, in]`, every value; it
    /// may start uninitialized).
    pub(crate) fn weight_gradient_into(&self, x: &[f32], dy: &[f32], dw: &mut [MaybeUninit<f32>]) {
        let xv = View::row_major(x, self.b, self.n_in);
        let gv = View::row_major(dy, self.b, self.n_out);
        product_into(Order::RowMajor, gv.t(), xv, dw);
    }

    /// The input's gradient `dy w` written into `dx` (`[b, in]`, every value; it may
    /// start uninitialized).
    pub(crate) fn input_gradient_into(&self, w: &[f32], dy: &[f32], dx: &mut [MaybeUninit<f32>]) {
        let wv = View::row_major(w, self.n_out, self.n_in);
        let gv = View::row_major(dy, self.b, self.n_out);
        product_into(Order::RowMajor, gv, wv, dx);
    }
}

impl CustomOp2 for LinearOp {
    cpu_forward!("linear", |op, a @ l1, b @ l2| {
        let core = LinearCore::of(l1.shape(), l2.shape())?;
        let y = core.forward(a, b);
        Ok((y, core.out_shape()))
    });

    fn bwd(&self, x: &Tensor, w: &Tensor, _y: &Tensor, grad: &Tensor) -> Grads2 {
        let core = LinearCore::of(x.shape(), w.shape())?;
        let (dw, dx) = with_values(x, |xv| {
            with_values(w, |wv| {
                with_values(&grad.contiguous()?, |gv| {
                    Ok(core.backward(xv, wv, gv, x.track_op()))
                })
            })
        })?;
        let dx = dx
            .map(|dx| Tensor::from_vec(dx, x.shape(), x.device()))
            .transpose()?;
        Ok((dx, gradient_like(dw, w)?))
    }
}
