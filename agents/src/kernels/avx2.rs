//! Functions compiled twice, for AVX2 and for the baseline target, with the AVX2 copy
//! chosen at run time where the CPU has it. The release build targets baseline x86-64
//! (so that one binary runs anywhere), which leaves the hot loops at 4-wide SSE.
//!
//! The body is a plain function inlined into both copies; passing it a closure instead
//! left the closure uninlined, outside the AVX2 copy (measured: no speed-up).
//!
//! ```text
//! avx2::dispatch! {
//!     /// `Σ x_i`.
//!     pub(crate) fn total(x: &[f32]) -> f32 {
//!         x.iter().sum()
//!     }
//! }
//! ```

/// Defines `fn name(args) [-> ret]` from a body, compiled for AVX2 and for the baseline,
/// choosing at run time. The loops must give the same result either way (no fused
/// multiply-adds, fixed order of additions), so results do not depend on the CPU.
macro_rules! dispatch {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn portable($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2")]
            unsafe fn avx2($($arg: $ty),*) $(-> $ret)? {
                portable($($arg),*)
            }
            #[cfg(target_arch = "x86_64")]
            if std::is_x86_feature_detected!("avx2") && !$crate::kernels::avx2::baseline_forced() {
                // SAFETY: the CPU supports AVX2, checked just above.
                return unsafe { avx2($($arg),*) };
            }
            portable($($arg),*)
        }
    };
}

pub(crate) use dispatch;

use std::cell::Cell;

thread_local! {
    /// Set while `on_baseline` runs: the dispatch takes the baseline copies.
    static BASELINE: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread is inside `on_baseline`.
#[inline]
pub(crate) fn baseline_forced() -> bool {
    BASELINE.with(Cell::get)
}

/// A path the dispatch can take on this machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// The copies compiled for the baseline target.
    Baseline,
    /// The copies compiled with AVX2 enabled.
    Avx2,
}

/// Every path this machine can run, the baseline first: tests run each fused kernel
/// on each, so that a kernel that differs between CPUs shows as a named path rather
/// than as a drifting trajectory.
pub fn paths() -> Vec<Path> {
    let mut paths = vec![Path::Baseline];
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        paths.push(Path::Avx2);
    }
    paths
}

/// Runs `f` with this thread's dispatch held to `path` (restored after, also on a
/// panic). `Path::Avx2` on a CPU without AVX2 runs the baseline, as the dispatch would.
#[cfg(any(test, feature = "test-support"))]
pub fn on_path<R>(path: Path, f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            BASELINE.with(|b| b.set(self.0));
        }
    }
    let _restore = Restore(BASELINE.with(|b| b.replace(path == Path::Baseline)));
    f()
}
