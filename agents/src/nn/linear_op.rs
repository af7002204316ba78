//! `y = x W^T` for Linear layers on the CPU as one op with a direct backward:
//! `dx = dy W` (skipped when `x` is data) and `dW = dy^T x`, both written contiguously.
//! Through candle's `matmul(w.t())` the weight gradient arrives transposed and is
//! accumulated by a strided add, which dominated small updates.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use normrl_agents::nn::Kernel;
//!
//! let fc = Kernel::Linear { n_in: 2, n_out: 1 };
//! let x = Tensor::new(&[[1.0f32, 2.0]], &Device::Cpu).unwrap();
//! let w = Tensor::new(&[[3.0f32, 4.0]], &Device::Cpu).unwrap();
//! assert_eq!(fc.apply(&x, &w).unwrap().to_vec2::<f32>().unwrap(), vec![vec![11.0]]);
//! ```

use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Storage, Tensor};

use super::dense::{f32_slice, product, transposed, Order, View};

pub(crate) struct LinearOp;

/// `(batch, features)` of an input `[B, ...]`: a conv output feeds a Linear layer
/// without a flatten (a graph node whose gradient candle zero-fills and adds).
fn rows(x: &Shape) -> Result<(usize, usize)> {
    match x.dims() {
        [] | [_] => candle_core::bail!("linear: input {x:?} has no batch dimension"),
        [b, ..] => Ok((*b, x.elem_count() / (*b).max(1))),
    }
}

impl CustomOp2 for LinearOp {
    fn name(&self) -> &'static str {
        "linear"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (x, w) = (f32_slice(s1, l1)?, f32_slice(s2, l2)?);
        let (b, n_in) = rows(l1.shape())?;
        let (n_out, w_in) = l2.shape().dims2()?;
        if w_in != n_in {
            candle_core::bail!(
                "linear: input {:?} does not fit weight {:?}",
                l1.shape(),
                l2.shape()
            );
        }
        let (x, w) = (View::row_major(x, b, n_in), View::row_major(w, n_out, n_in));
        // y [b, out] = x [b, in] * W^T [in, out]. Written row-major, gemm packs
        // (gathers) all of W; written column-major it packs x instead, and y then needs
        // a transpose. That pays for large weights and small batches.
        let y = if b < n_out && n_out * n_in >= 1 << 14 {
            transposed(&product(Order::ColMajor, x, w.t()), 1, n_out, b, 1)
        } else {
            product(Order::RowMajor, x, w.t())
        };
        Ok((CpuStorage::F32(y), Shape::from((b, n_out))))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _y: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let grad = grad.contiguous()?;
        let (b, n_in) = rows(x.shape())?;
        let n_out = w.dim(0)?;
        let (xs, xl) = x.storage_and_layout();
        let (ws, wl) = w.storage_and_layout();
        let (gs, gl) = grad.storage_and_layout();
        let (Storage::Cpu(xc), Storage::Cpu(wc), Storage::Cpu(gc)) = (&*xs, &*ws, &*gs) else {
            candle_core::bail!("the linear op runs on the CPU only");
        };
        let xv = View::row_major(f32_slice(xc, xl)?, b, n_in);
        let wv = View::row_major(f32_slice(wc, wl)?, n_out, n_in);
        let gv = View::row_major(f32_slice(gc, gl)?, b, n_out);
        // dW [out, in] = dy^T [out, b] * x [b, in]
        let dw = product(Order::RowMajor, gv.t(), xv);
        let dx = if x.track_op() {
            // dx [b, in] = dy [b, out] * W [out, in]
            let dx = product(Order::RowMajor, gv, wv);
            Some(Tensor::from_vec(dx, x.shape(), x.device())?)
        } else {
            None
        };
        Ok((dx, Some(Tensor::from_vec(dw, (n_out, n_in), w.device())?)))
    }
}
