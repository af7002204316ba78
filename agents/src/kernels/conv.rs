//! A convolution for layers whose input is data (the observations): im2col of the
//! whole batch plus one matrix product, with a backward that computes only the weight
//! gradient.
//! candle's `conv2d` also computes the input gradient (a transposed convolution) even
//! when nobody needs it, which made it most of a MinAtar update.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use normrl_agents::nn::LinearMap;
//!
//! let conv = LinearMap::Conv2d { c_in: 1, c_out: 1, k: 2, stride: 1, padding: 0 };
//! let x = Tensor::new(&[[[[1.0f32, 2.0], [3.0, 4.0]]]], &Device::Cpu).unwrap();
//! let w = Tensor::new(&[[[[1.0f32, 0.0], [0.0, 1.0]]]], &Device::Cpu).unwrap();
//! let y = conv.apply(&x, &w).unwrap(); // x is data: the im2col path
//! assert_eq!(y.flatten_all().unwrap().to_vec1::<f32>().unwrap(), vec![5.0]);
//! ```

use candle_core::{CustomOp2, Result, Shape, Tensor};

use super::dense::{product, transposed, Order, View};
use super::product::Product;
use super::with_values;
use super::{cpu_forward, gradient_like, Grads2};

/// Shape parameters of one convolution.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DataConv2d {
    pub(crate) k: usize,
    pub(crate) stride: usize,
}

/// The sizes of one batch's convolution.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dims {
    batch: usize,
    c_in: usize,
    h: usize,
    w: usize,
    c_out: usize,
    k: usize,
    stride: usize,
    oh: usize,
    ow: usize,
}

impl Dims {
    /// A batch of `batch` inputs `[c_in, h, w]` under `c_out` filters of `k x k`.
    pub(crate) fn new(
        batch: usize,
        c_out: usize,
        (c_in, h, w): (usize, usize, usize),
        k: usize,
        stride: usize,
    ) -> Result<Self> {
        if k == 0 || stride == 0 || h < k || w < k {
            candle_core::bail!("convolution: a {k}x{k} kernel, stride {stride}, on {h}x{w}");
        }
        Ok(Self {
            batch,
            c_in,
            h,
            w,
            c_out,
            k,
            stride,
            oh: (h - k) / stride + 1,
            ow: (w - k) / stride + 1,
        })
    }
    /// Values per patch: `c_in * k * k`.
    pub(crate) fn patch(&self) -> usize {
        self.c_in * self.k * self.k
    }
    /// Output positions per sample.
    pub(crate) fn positions(&self) -> usize {
        self.oh * self.ow
    }
    /// Output positions of the whole batch.
    pub(crate) fn columns(&self) -> usize {
        self.batch * self.positions()
    }
    pub(crate) fn batch(&self) -> usize {
        self.batch
    }
    pub(crate) fn c_out(&self) -> usize {
        self.c_out
    }
    /// The batch `x`'s patches as columns ([`im2col`]).
    pub(crate) fn im2col(&self, x: &[f32]) -> Vec<f32> {
        im2col(self, x)
    }
}

impl DataConv2d {
    /// `x (*) w` for data `x` (no gradient flows to it).
    pub(crate) fn apply(&self, x: &Tensor, w: &Tensor) -> Result<Tensor> {
        let (cols, d) = self.columns(x, w)?;
        cols.apply_op2(&w.contiguous()?, ColumnConv(d))
    }

    /// The batch's im2col columns and the convolution's sizes, for weight `w`.
    pub(crate) fn columns(&self, x: &Tensor, w: &Tensor) -> Result<(Tensor, Dims)> {
        let (batch, c_in, h, wd) = x.dims4()?;
        let (c_out, wc, kh, kw) = w.dims4()?;
        let k = self.k;
        if wc != c_in || kh != k || kw != k || h < k || wd < k {
            candle_core::bail!(
                "data convolution: input {:?} does not fit weight {:?}",
                x.shape(),
                w.shape()
            );
        }
        let d = Dims::new(batch, c_out, (c_in, h, wd), k, self.stride)?;
        let cols = with_values(&x.contiguous()?, |x| Ok(im2col(&d, x)))?;
        Ok((
            Tensor::from_vec(cols, (d.patch(), d.columns()), x.device())?,
            d,
        ))
    }
}

/// The batch's patches as columns: `[c_in * k * k, batch * positions]`, one row per
/// kernel tap, so that each output row of a tap is one contiguous run.
fn im2col(d: &Dims, x: &[f32]) -> Vec<f32> {
    let (k, s) = (d.k, d.stride);
    let plane = d.h * d.w;
    let mut cols = Vec::with_capacity(d.patch() * d.columns());
    for c in 0..d.c_in {
        for ky in 0..k {
            for kx in 0..k {
                for b in 0..d.batch {
                    let src = &x[(b * d.c_in + c) * plane..(b * d.c_in + c + 1) * plane];
                    for oy in 0..d.oh {
                        let from = (oy * s + ky) * d.w + kx;
                        if s == 1 {
                            extend_run(&mut cols, &src[from..from + d.ow]);
                        } else {
                            cols.extend((0..d.ow).map(|ox| src[from + ox * s]));
                        }
                    }
                }
            }
        }
    }
    cols
}

/// Appends a short run: whole groups of eight as fixed-size copies, which the compiler
/// inlines (a `memcpy` call per run of eight values cost more than the copy itself).
#[inline(always)]
fn extend_run(cols: &mut Vec<f32>, run: &[f32]) {
    let groups = run.chunks_exact(8);
    let rest = groups.remainder();
    for group in groups {
        let group: &[f32; 8] = group.try_into().expect("chunks of eight");
        cols.extend_from_slice(group);
    }
    if !rest.is_empty() {
        cols.extend_from_slice(rest);
    }
}

impl Product for Dims {
    fn out_shape(&self) -> Shape {
        Shape::from((self.batch, self.c_out, self.oh, self.ow))
    }

    fn forward(&self, cols: &[f32], w: &[f32]) -> Vec<f32> {
        // [c_out, batch * positions] = w [c_out, patch] * cols [patch, batch * positions]
        let by_channel = product(
            Order::RowMajor,
            View::row_major(w, self.c_out, self.patch()),
            View::row_major(cols, self.patch(), self.columns()),
        );
        transposed(&by_channel, 1, self.c_out, self.batch, self.positions())
    }

    fn backward(
        &self,
        cols: &[f32],
        _w: &[f32],
        dy: &[f32],
        _input_gradient: bool,
    ) -> (Vec<f32>, Option<Vec<f32>>) {
        let by_channel = transposed(dy, 1, self.batch, self.c_out, self.positions());
        // dW [c_out, patch] = grad [c_out, batch * positions] * cols^T, computed
        // transposed so that the long operands are read in place.
        let dw_t = product(
            Order::ColMajor,
            View::row_major(&by_channel, self.c_out, self.columns()),
            View::row_major(cols, self.patch(), self.columns()).t(),
        );
        // The columns are data: no gradient flows to them.
        (transposed(&dw_t, 1, self.patch(), self.c_out, 1), None)
    }
}

/// The convolution as one product of the weight with the batch's columns.
struct ColumnConv(Dims);

impl CustomOp2 for ColumnConv {
    cpu_forward!("data-conv2d", |op, a @ l1, b @ l2| {
        let out = op.0.forward(a, b);
        Ok((out, op.0.out_shape()))
    });

    fn bwd(&self, cols: &Tensor, w: &Tensor, _out: &Tensor, grad: &Tensor) -> Grads2 {
        let (dw, _) = with_values(cols, |cols| {
            with_values(&grad.contiguous()?, |g| {
                Ok(self.0.backward(cols, &[], g, false))
            })
        })?;
        Ok((None, gradient_like(dw, w)?))
    }
}
