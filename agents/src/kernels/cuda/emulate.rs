//! Runs a kernel of this folder on the host, for the tests: the kernels are compiled
//! by the host's C++ compiler under `emulate.h`, and a launch here runs each block in
//! turn with its threads as OS threads (so `__syncthreads` and shared memory behave as
//! on a GPU). Launches take a lock: a kernel's shared memory is a static.

use std::sync::Mutex;

unsafe extern "C" {
    fn normrl_emu_block_begin(threads: u32);
    fn normrl_emu_set(thread: u32, block: *const u32, block_dim: u32, grid: *const u32);
}

static LAUNCH: Mutex<()> = Mutex::new(());

/// A raw pointer that a test hands to a kernel running on several threads.
#[derive(Clone, Copy)]
pub(crate) struct Ptr<T>(pub *mut T);
unsafe impl<T> Send for Ptr<T> {}
unsafe impl<T> Sync for Ptr<T> {}

impl<T> Ptr<T> {
    pub(crate) fn of(values: &mut [T]) -> Self {
        Self(values.as_mut_ptr())
    }
    pub(crate) fn read(values: &[T]) -> Self {
        Self(values.as_ptr().cast_mut())
    }
    pub(crate) fn null() -> Self {
        Self(std::ptr::null_mut())
    }
    /// The pointer (a method, so that a closure captures the whole `Ptr`, which is
    /// `Sync`, not its field).
    pub(crate) fn p(self) -> *mut T {
        self.0
    }
}

/// Runs `kernel` (one call of the compiled kernel with its arguments) over `grid`
/// blocks of `block` threads.
pub(crate) fn launch(grid: [u32; 3], block: u32, kernel: impl Fn() + Sync) {
    let _one_at_a_time = LAUNCH.lock().unwrap_or_else(|e| e.into_inner());
    for z in 0..grid[2] {
        for y in 0..grid[1] {
            for x in 0..grid[0] {
                let at = [x, y, z];
                unsafe { normrl_emu_block_begin(block) };
                std::thread::scope(|s| {
                    for t in 0..block {
                        let kernel = &kernel;
                        s.spawn(move || {
                            unsafe { normrl_emu_set(t, at.as_ptr(), block, grid.as_ptr()) };
                            kernel();
                        });
                    }
                });
            }
        }
    }
}
