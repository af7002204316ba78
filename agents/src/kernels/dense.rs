//! Dense-matrix helpers shared by the fused CPU ops: `f32` views of candle storage,
//! strided matrix views, a single-threaded product through the `gemm` crate, and a
//! transposing copy.
//!
//! The product is where the layout matters: `gemm` works column-major and, when the
//! destination is row-major, transposes the whole problem, so a row-major weight
//! `[out, in]` on the left gets packed (a strided gather of every weight, each call).
//! Callers pick the destination order that keeps their largest operand unpacked.

use candle_core::{CpuStorage, Layout, Result};
use std::mem::MaybeUninit;

/// The `f32` values of a contiguous CPU storage.
#[inline]
pub(crate) fn f32_slice<'a>(s: &'a CpuStorage, l: &Layout) -> Result<&'a [f32]> {
    match (s, l.contiguous_offsets()) {
        (CpuStorage::F32(v), Some((a, b))) => Ok(&v[a..b]),
        _ => candle_core::bail!("fused CPU ops need contiguous f32 tensors"),
    }
}

/// The `f32` values of a contiguous CPU storage, to change in place (an in-place op).
#[inline]
pub(crate) fn f32_slice_mut<'a>(s: &'a mut CpuStorage, l: &Layout) -> Result<&'a mut [f32]> {
    match (s, l.contiguous_offsets()) {
        (CpuStorage::F32(v), Some((a, b))) => Ok(&mut v[a..b]),
        _ => candle_core::bail!("in-place CPU ops need contiguous f32 tensors"),
    }
}

/// A `rows x cols` matrix whose element `(i, j)` is `data[i * rs + j * cs]`.
#[derive(Clone, Copy)]
pub(crate) struct View<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    rs: isize,
    cs: isize,
}

impl<'a> View<'a> {
    /// A dense row-major matrix.
    pub(crate) fn row_major(data: &'a [f32], rows: usize, cols: usize) -> Self {
        assert!(data.len() >= rows * cols, "matrix view out of bounds");
        Self {
            data,
            rows,
            cols,
            rs: cols as isize,
            cs: 1,
        }
    }

    /// The transpose, without copying.
    pub(crate) fn t(self) -> Self {
        Self {
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
            ..self
        }
    }
}

/// The order of a product's destination.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Order {
    RowMajor,
    ColMajor,
}

/// `a * b` in a new buffer.
pub(crate) fn product(order: Order, a: View, b: View) -> Vec<f32> {
    let len = a.rows * b.cols;
    let mut dst = Vec::with_capacity(len);
    // SAFETY: without `accumulate`, every value of the destination is written and none
    // is read, so the spare capacity may start uninitialized.
    unsafe {
        matmul_raw(dst.as_mut_ptr(), order, a, b);
        dst.set_len(len);
    }
    dst
}

/// `a * b` written into `dst` (at least `a.rows * b.cols` values, which may start
/// uninitialized: a population writes each agent's product into its run of the stacked
/// output, with no copy and no zero fill first). Every one of those values is written.
pub(crate) fn product_into(order: Order, a: View, b: View, dst: &mut [MaybeUninit<f32>]) {
    assert!(
        dst.len() >= a.rows * b.cols,
        "matrix product destination too small"
    );
    // SAFETY: `dst` holds at least the product's values, and the product never reads
    // its destination.
    unsafe { matmul_raw(dst.as_mut_ptr().cast::<f32>(), order, a, b) }
}

/// A vector of `len` values, each agent's run (of `len / agents`) written by `write`
/// into its uninitialized run; `write` must write every value of the run it is given.
/// For a population's products: the zero fill of `vec![0.0; len]` cost as much as a
/// pass of its own.
pub(crate) fn written_by_agents(
    len: usize,
    agents: usize,
    mut write: impl FnMut(usize, &mut [MaybeUninit<f32>]),
) -> Vec<f32> {
    let mut out = Vec::with_capacity(len);
    let runs = out.spare_capacity_mut()[..len].chunks_mut(len / agents.max(1));
    for (i, run) in runs.enumerate() {
        write(i, run);
    }
    // SAFETY: every run of the `len` values was written by `write`.
    unsafe { out.set_len(len) };
    out
}

/// Which of gemm's kernel families this CPU runs the matrix products on: `avx512`,
/// `avx2`, `neon` or `scalar`. The families sum in different orders, so two CPUs
/// taking different ones train the same config and seed to different roundings (each
/// bit for bit on its own); gemm chooses by the same tests, once per process.
pub fn product_kernels() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            return "avx512";
        }
        if std::is_x86_feature_detected!("fma") {
            return "avx2";
        }
    }
    #[cfg(target_arch = "aarch64")]
    if std::arch::is_aarch64_feature_detected!("neon") {
        return "neon";
    }
    "scalar"
}

/// `dst = a * b`, `dst` dense in `order`, single-threaded. Never reads `dst`.
///
/// # Safety
/// `dst` must be valid for writes of `a.rows * b.cols` values.
unsafe fn matmul_raw(dst: *mut f32, order: Order, a: View, b: View) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert!(b.rows == k, "matrix product dimensions");
    if k == 0 {
        std::ptr::write_bytes(dst, 0, m * n);
        return;
    }
    let (dst_rs, dst_cs) = match order {
        Order::RowMajor => (n as isize, 1),
        Order::ColMajor => (1, m as isize),
    };
    // SAFETY: views are dense row-major matrices (or their transposes) checked to fit
    // their slices; the caller vouches for `dst`.
    gemm::gemm(
        m,
        n,
        k,
        dst,
        dst_cs,
        dst_rs,
        false,
        a.data.as_ptr(),
        a.cs,
        a.rs,
        b.data.as_ptr(),
        b.cs,
        b.rs,
        1.0,
        1.0,
        false,
        false,
        false,
        gemm::Parallelism::None,
    )
}

/// `blocks` blocks of a row-major `rows x cols` matrix of `inner`-value cells, each
/// block with its rows and columns swapped, in a new buffer.
pub(crate) fn transposed(
    src: &[f32],
    blocks: usize,
    rows: usize,
    cols: usize,
    inner: usize,
) -> Vec<f32> {
    let block = rows * cols * inner;
    assert!(src.len() >= blocks * block, "transpose out of bounds");
    let mut dst = Vec::with_capacity(blocks * block);
    for s in src.chunks_exact(block).take(blocks) {
        if inner == 1 {
            for c in 0..cols {
                dst.extend((0..rows).map(|r| s[r * cols + c]));
            }
            continue;
        }
        for c in 0..cols {
            for r in 0..rows {
                let from = (r * cols + c) * inner;
                dst.extend_from_slice(&s[from..from + inner]);
            }
        }
    }
    dst
}

crate::kernels::avx2::dispatch! {
    /// `a . b` over eight interleaved partial sums ([`lane_sum`]); the order of additions
    /// is fixed, so the result does not depend on the CPU.
    pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
        lane_sum(a, b, |x, y| x * y)
    }
}

/// `Σ f(x_i, y_i)` over eight interleaved partial sums: independent additions that
/// pipeline (one running sum waits on each addition), in a fixed order. The sum is
/// kept in `f`'s type (`f32`, or `f64` where precision matters).
#[inline(always)]
pub(crate) fn lane_sum<A>(x: &[f32], y: &[f32], f: impl Fn(f32, f32) -> A) -> A
where
    A: Copy + Default + std::ops::AddAssign + std::iter::Sum,
{
    let mut lanes = [A::default(); 8];
    let (cx, cy) = (x.chunks_exact(8), y.chunks_exact(8));
    let mut tail = A::default();
    for (&x, &y) in cx.remainder().iter().zip(cy.remainder()) {
        tail += f(x, y);
    }
    for (xs, ys) in cx.zip(cy) {
        for ((lane, &x), &y) in lanes.iter_mut().zip(xs).zip(ys) {
            *lane += f(x, y);
        }
    }
    let mut total: A = lanes.into_iter().sum();
    total += tail;
    total
}
