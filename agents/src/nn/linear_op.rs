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

use super::data_conv::{f32_slice, matmul};

pub(crate) struct LinearOp;

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
        let (b, n_in) = l1.shape().dims2()?;
        let (n_out, w_in) = l2.shape().dims2()?;
        if w_in != n_in {
            candle_core::bail!(
                "linear: input {:?} does not fit weight {:?}",
                l1.shape(),
                l2.shape()
            );
        }
        let mut y = vec![0f32; b * n_out];
        // y [b, out] = x [b, in] * W^T [in, out]
        matmul(
            b,
            n_out,
            n_in,
            &mut y,
            false,
            x,
            (n_in as isize, 1),
            w,
            (1, n_in as isize),
        );
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
        let (b, n_in) = x.dims2()?;
        let n_out = w.dim(0)?;
        let (xs, xl) = x.storage_and_layout();
        let (ws, wl) = w.storage_and_layout();
        let (gs, gl) = grad.storage_and_layout();
        let (Storage::Cpu(xc), Storage::Cpu(wc), Storage::Cpu(gc)) = (&*xs, &*ws, &*gs) else {
            candle_core::bail!("the linear op runs on the CPU only");
        };
        let (xv, wv, gv) = (f32_slice(xc, xl)?, f32_slice(wc, wl)?, f32_slice(gc, gl)?);
        // dW [out, in] = dy^T [out, b] * x [b, in]
        let mut dw = vec![0f32; n_out * n_in];
        matmul(
            n_out,
            n_in,
            b,
            &mut dw,
            false,
            gv,
            (1, n_out as isize),
            xv,
            (n_in as isize, 1),
        );
        let dx = if x.track_op() {
            // dx [b, in] = dy [b, out] * W [out, in]
            let mut dx = vec![0f32; b * n_in];
            matmul(
                b,
                n_in,
                n_out,
                &mut dx,
                false,
                gv,
                (n_out as isize, 1),
                wv,
                (n_in as isize, 1),
            );
            Some(Tensor::from_vec(dx, (b, n_in), x.device())?)
        } else {
            None
        };
        Ok((dx, Some(Tensor::from_vec(dw, (n_out, n_in), w.device())?)))
    }
}
