//! A convolution for layers whose input is data (the observations): im2col plus one
//! matrix product per sample, with a backward that computes only the weight gradient.
//! candle's `conv2d` also computes the input gradient (a transposed convolution) even
//! when nobody needs it, which made it most of a MinAtar update.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use normrl_agents::nn::Kernel;
//!
//! let conv = Kernel::Conv2d { c_in: 1, c_out: 1, k: 2, stride: 1, padding: 0 };
//! let x = Tensor::new(&[[[[1.0f32, 2.0], [3.0, 4.0]]]], &Device::Cpu).unwrap();
//! let w = Tensor::new(&[[[[1.0f32, 0.0], [0.0, 1.0]]]], &Device::Cpu).unwrap();
//! let y = conv.apply(&x, &w).unwrap(); // x is data: the im2col path
//! assert_eq!(y.flatten_all().unwrap().to_vec1::<f32>().unwrap(), vec![5.0]);
//! ```

use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Storage, Tensor};

/// Shape parameters of one convolution.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DataConv2d {
    pub(crate) k: usize,
    pub(crate) stride: usize,
}

struct Dims {
    batch: usize,
    c_in: usize,
    h: usize,
    w: usize,
    c_out: usize,
    oh: usize,
    ow: usize,
}

impl Dims {
    /// Values per im2col row: `c_in * k * k`.
    fn patch(&self, k: usize) -> usize {
        self.c_in * k * k
    }
    /// Output positions per sample.
    fn positions(&self) -> usize {
        self.oh * self.ow
    }
}

/// The `f32` values of a contiguous CPU storage (shared by the fused ops).
pub(crate) fn f32_slice<'a>(s: &'a CpuStorage, l: &Layout) -> Result<&'a [f32]> {
    match (s, l.contiguous_offsets()) {
        (CpuStorage::F32(v), Some((a, b))) => Ok(&v[a..b]),
        _ => candle_core::bail!("fused CPU ops need contiguous f32 tensors"),
    }
}

/// `dst (m x n, row-major) (+)= a (m x k) * b (k x n)`, strides given as (row, col).
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [f32],
    accumulate: bool,
    a: &[f32],
    a_strides: (isize, isize),
    b: &[f32],
    b_strides: (isize, isize),
) {
    debug_assert!(dst.len() >= m * n);
    // SAFETY: the slices cover every index the strides reach: callers pass dense
    // matrices of exactly these dimensions.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            a.as_ptr(),
            a_strides.1,
            a_strides.0,
            b.as_ptr(),
            b_strides.1,
            b_strides.0,
            1.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}

impl DataConv2d {
    fn dims(&self, x: &Layout, w: &Layout) -> Result<Dims> {
        let (batch, c_in, h, wd) = x.shape().dims4()?;
        let (c_out, wc, kh, kw) = w.shape().dims4()?;
        if wc != c_in || kh != self.k || kw != self.k || h < self.k || wd < self.k {
            candle_core::bail!(
                "data convolution: input {:?} does not fit weight {:?}",
                x.shape(),
                w.shape()
            );
        }
        Ok(Dims {
            batch,
            c_in,
            h,
            w: wd,
            c_out,
            oh: (h - self.k) / self.stride + 1,
            ow: (wd - self.k) / self.stride + 1,
        })
    }

    /// The patches of sample `b` as rows: `[positions, c_in * k * k]`.
    fn im2col(&self, d: &Dims, x: &[f32], b: usize, cols: &mut [f32]) {
        let (k, s) = (self.k, self.stride);
        let patch = d.patch(k);
        let sample = &x[b * d.c_in * d.h * d.w..(b + 1) * d.c_in * d.h * d.w];
        for oy in 0..d.oh {
            for ox in 0..d.ow {
                let row = &mut cols[(oy * d.ow + ox) * patch..(oy * d.ow + ox + 1) * patch];
                let mut i = 0;
                for c in 0..d.c_in {
                    for ky in 0..k {
                        let start = c * d.h * d.w + (oy * s + ky) * d.w + ox * s;
                        row[i..i + k].copy_from_slice(&sample[start..start + k]);
                        i += k;
                    }
                }
            }
        }
    }
}

impl CustomOp2 for DataConv2d {
    fn name(&self) -> &'static str {
        "data-conv2d"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let d = self.dims(l1, l2)?;
        let (x, w) = (f32_slice(s1, l1)?, f32_slice(s2, l2)?);
        let (patch, positions) = (d.patch(self.k), d.positions());
        let mut cols = vec![0f32; positions * patch];
        let mut out = vec![0f32; d.batch * d.c_out * positions];
        for b in 0..d.batch {
            self.im2col(&d, x, b, &mut cols);
            // out_b [c_out, positions] = w [c_out, patch] * cols_b^T [patch, positions]
            let dst = &mut out[b * d.c_out * positions..(b + 1) * d.c_out * positions];
            matmul(
                d.c_out,
                positions,
                patch,
                dst,
                false,
                w,
                (patch as isize, 1),
                &cols,
                (1, patch as isize),
            );
        }
        Ok((
            CpuStorage::F32(out),
            Shape::from((d.batch, d.c_out, d.oh, d.ow)),
        ))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _out: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let grad = grad.contiguous()?;
        let (xs, xl) = x.storage_and_layout();
        let (gs, gl) = grad.storage_and_layout();
        let (Storage::Cpu(xc), Storage::Cpu(gc)) = (&*xs, &*gs) else {
            candle_core::bail!("data convolution runs on the CPU only");
        };
        let d = self.dims(xl, w.layout())?;
        let (xv, gv) = (f32_slice(xc, xl)?, f32_slice(gc, gl)?);
        let (patch, positions) = (d.patch(self.k), d.positions());
        let mut cols = vec![0f32; positions * patch];
        let mut dw = vec![0f32; d.c_out * patch];
        for b in 0..d.batch {
            self.im2col(&d, xv, b, &mut cols);
            // dW [c_out, patch] += grad_b [c_out, positions] * cols_b [positions, patch]
            let g = &gv[b * d.c_out * positions..(b + 1) * d.c_out * positions];
            matmul(
                d.c_out,
                patch,
                positions,
                &mut dw,
                b > 0,
                g,
                (positions as isize, 1),
                &cols,
                (patch as isize, 1),
            );
        }
        let dw = Tensor::from_vec(dw, w.shape(), w.device())?;
        // The input is data: no gradient flows to it.
        Ok((None, Some(dw)))
    }
}
