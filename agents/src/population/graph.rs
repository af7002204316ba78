//! A population's step captured once as a CUDA graph and replayed: one launch for the
//! step's few dozen kernels, where each eager launch costs the host several
//! microseconds.
//!
//! What a replay needs of the captured work (`region`), and how the population gives it:
//! - every tensor it reads or writes across steps keeps its address: the variables,
//!   buffers and optimizer state are written in place, the batch and the acting
//!   observations are written into fixed buffers before the launch (`inputs.rs`), and
//!   its results are copied into fixed outputs;
//! - nothing it reads from the host changes between steps: what does (Adam's bias
//!   corrections) is written to the device before the launch, the rest is fixed for
//!   the run (the learning rates, discounts, the optimizer's table of addresses, which
//!   are the graph's own);
//! - it reads nothing back and uploads nothing; candle's few small uploads of strided
//!   layouts are served from its cache, filled by the eager steps before the capture
//!   ([`WARM_STEPS`]);
//! - no cache carries a tensor into or out of it ([`capturing`]: weight norm's formed
//!   scale is made inside the captured step);
//! - every tensor it makes is dropped inside it, so the graph frees what it allocates.
//!
//! The capture is checked once: the same step is run eagerly and replayed from the same
//! state, and a replay that differs (or a capture CUDA refuses) leaves the population
//! on eager steps, said once on standard error. A method whose step changes from step
//! to step on the host (batch renormalization's warm-up) is not `ready` until it stops.

use std::cell::Cell;

use candle_core::{Device, Result, Tensor};

thread_local! {
    static CAPTURING: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread is capturing a step: a cache of values formed from the variables
/// (weight norm's scale) is then neither read nor filled, as a replay must form them
/// from its own step's variables, inside the graph.
pub(crate) fn capturing() -> bool {
    CAPTURING.with(Cell::get)
}

/// Eager steps before the capture: they load the kernels' modules and fill candle's
/// cache of small uploads, which a capture may not make.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) const WARM_STEPS: u32 = 2;

/// How far a replay may be from the eager step (relative, on each buffer's sum of
/// magnitudes and of squares): the same kernels on the same values agree to rounding.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
const REPLAY_TOLERANCE: f64 = 1e-5;

/// One step kind's graph (the update, or the acting forward).
pub(crate) struct StepGraph {
    what: &'static str,
    state: State,
}

enum State {
    /// Eager steps so far, the capture after [`WARM_STEPS`].
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    Eager(u32),
    #[cfg(feature = "cuda")]
    Replay(cuda::Graph),
    /// Eager for good: graphs are off, or the capture failed (said once).
    Off,
}

impl StepGraph {
    /// `enabled`: the run's `run.cuda_graphs`.
    pub(crate) fn new(what: &'static str, enabled: bool) -> Self {
        let state = match enabled {
            true => State::Eager(0),
            false => State::Off,
        };
        Self { what, state }
    }

    /// Whether steps replay the captured graph.
    pub(crate) fn replays(&self) -> bool {
        match &self.state {
            #[cfg(feature = "cuda")]
            State::Replay(_) => true,
            _ => false,
        }
    }

    /// The fixed buffers moved: a graph captured over the old ones is dropped, and the
    /// next steps capture again.
    pub(crate) fn recapture(&mut self) {
        if !matches!(self.state, State::Off) {
            self.state = State::Eager(0);
        }
    }

    /// Runs `region`, the step's device work over the device buffers `held` (all it
    /// writes) and the step's fixed inputs: eagerly, or as the graph's replay once it
    /// is captured and checked. `ready`: the step may be captured now (a CUDA device,
    /// the kernels' path, nothing on the host that changes from step to step).
    pub(crate) fn run(
        &mut self,
        device: &Device,
        ready: bool,
        held: &[Tensor],
        region: &dyn Fn() -> Result<()>,
    ) -> Result<()> {
        #[cfg(feature = "cuda")]
        if let (Device::Cuda(dev), true) = (device, ready) {
            return self.run_on_cuda(dev, held, region);
        }
        let _ = (device, ready, held);
        region()
    }

    /// Says once that steps stay eager, and why.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    fn stay_eager(&mut self, why: &str) {
        eprintln!(
            "population: the {} runs eagerly (no CUDA graph): {why}",
            self.what
        );
        self.state = State::Off;
    }
}

/// Copies of `held` (device copies: the state a capture's check starts from).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn copies(held: &[Tensor]) -> Result<Vec<Tensor>> {
    held.iter().map(Tensor::copy).collect()
}

/// Writes `saved` back into `held`, in place (each keeps its address).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn restore(held: &[Tensor], saved: &[Tensor]) -> Result<()> {
    for (t, s) in held.iter().zip(saved) {
        if t.rank() == 0 {
            t.reshape(1)?.slice_set(&s.reshape(1)?, 0, 0)?;
        } else {
            t.slice_set(s, 0, 0)?;
        }
    }
    Ok(())
}

/// Each of `held`'s sum of magnitudes and sum of squares, in f64, read to the host.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn fingerprint(held: &[Tensor]) -> Result<Vec<f64>> {
    let mut sums = Vec::with_capacity(2 * held.len());
    for t in held {
        let wide = t.to_dtype(candle_core::DType::F64)?;
        sums.push(wide.abs()?.sum_all()?);
        sums.push(wide.sqr()?.sum_all()?);
    }
    crate::count::read_to_host(&Tensor::stack(&sums, 0)?)
}

/// The largest relative difference of two fingerprints.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn largest_difference(a: &[f64], b: &[f64]) -> f64 {
    let apart = |(x, y): (&f64, &f64)| (x - y).abs() / x.abs().max(y.abs()).max(1e-30);
    a.iter().zip(b).map(apart).fold(0.0, f64::max)
}

#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::cuda_backend::cudarc::driver::sys::{
        CUgraphInstantiate_flags, CUstreamCaptureMode,
    };
    use candle_core::cuda_backend::cudarc::driver::CudaGraph;
    use candle_core::cuda_backend::{CudaDevice, WrapErr};
    use candle_core::{Result, Tensor};

    use super::{State, StepGraph, CAPTURING, REPLAY_TOLERANCE, WARM_STEPS};

    /// A captured step. `CudaGraph` is not `Send` (a graph may not be used from two
    /// threads at once); a population's graph is used by whoever holds it mutably, one
    /// thread at a time, which is what CUDA asks.
    pub(super) struct Graph(CudaGraph);
    unsafe impl Send for Graph {}

    impl StepGraph {
        pub(super) fn run_on_cuda(
            &mut self,
            dev: &CudaDevice,
            held: &[Tensor],
            region: &dyn Fn() -> Result<()>,
        ) -> Result<()> {
            match &self.state {
                State::Off => region(),
                State::Replay(graph) => match graph.0.launch() {
                    Ok(()) => Ok(()),
                    Err(e) => {
                        // A launch that fails is refused before it runs: the step
                        // is still to do.
                        let _ = dev.cuda_stream().context().check_err();
                        self.stay_eager(&format!("its replay failed ({e:?})"));
                        region()
                    }
                },
                &State::Eager(n) if n < WARM_STEPS => {
                    let _cache = dev.enable_cuda_graph_htod_cache();
                    region()?;
                    self.state = State::Eager(n + 1);
                    Ok(())
                }
                State::Eager(_) => self.capture_checked(dev, held, region),
            }
        }

        /// Runs the step eagerly, then from the same state captures and replays it;
        /// keeps the graph if the replay equals the eager step.
        fn capture_checked(
            &mut self,
            dev: &CudaDevice,
            held: &[Tensor],
            region: &dyn Fn() -> Result<()>,
        ) -> Result<()> {
            let saved = super::copies(held)?;
            {
                let _cache = dev.enable_cuda_graph_htod_cache();
                region()?;
            }
            let eager = super::fingerprint(held)?;
            super::restore(held, &saved)?;
            let graph = match capture(dev, region) {
                Ok(graph) => graph,
                Err(e) => {
                    self.stay_eager(&format!("CUDA refused its capture ({e})"));
                    return region();
                }
            };
            graph.launch().w()?;
            let difference = super::largest_difference(&eager, &super::fingerprint(held)?);
            if difference > REPLAY_TOLERANCE {
                super::restore(held, &saved)?;
                self.stay_eager(&format!(
                    "its replay differed from the eager step by {difference:e}"
                ));
                return region();
            }
            eprintln!(
                "population: the {} replays as one CUDA graph (its replay equals the eager step to {difference:e})",
                self.what
            );
            self.state = State::Replay(Graph(graph));
            Ok(())
        }
    }

    /// `region` captured on candle's stream, nothing run. The stream leaves capture
    /// whatever happens.
    fn capture(dev: &CudaDevice, region: &dyn Fn() -> Result<()>) -> Result<CudaGraph> {
        let stream = dev.cuda_stream();
        let _cache = dev.enable_cuda_graph_htod_cache();
        let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        stream.begin_capture(mode).w()?;
        CAPTURING.with(|c| c.set(true));
        let captured = region();
        CAPTURING.with(|c| c.set(false));
        let graph = stream.end_capture(CUgraphInstantiate_flags(0));
        if captured.is_err() || graph.is_err() {
            // Frees and launches refused inside a broken capture leave an error for
            // the next call: it belongs to the capture.
            let _ = stream.context().check_err();
        }
        captured?;
        match graph.w()? {
            Some(graph) => Ok(graph),
            None => candle_core::bail!("the capture recorded nothing"),
        }
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor};

    use super::*;

    /// A capture's check restores the state it started from in place (each buffer
    /// keeps its storage, as the graph's addresses need), and tells a replay that
    /// moved one value from one that did not.
    #[test]
    fn the_check_restores_in_place_and_sees_a_difference() {
        let dev = Device::Cpu;
        let held = [
            Tensor::new(&[[1f32, -2.0], [3.0, 4.0]], &dev).unwrap(),
            Tensor::new(&[7u32, 9], &dev).unwrap(),
            Tensor::new(2.5f32, &dev).unwrap(),
        ];
        let at: Vec<usize> = held.iter().map(super::super::inputs::cpu_address).collect();
        let saved = copies(&held).unwrap();
        let before = fingerprint(&held).unwrap();
        held[0]
            .slice_set(&Tensor::new(&[[0f32, 0.0]], &dev).unwrap(), 0, 1)
            .unwrap();
        held[2]
            .reshape(1)
            .unwrap()
            .slice_set(&Tensor::new(&[1f32], &dev).unwrap(), 0, 0)
            .unwrap();
        let changed = fingerprint(&held).unwrap();
        assert!(largest_difference(&before, &changed) > REPLAY_TOLERANCE);
        restore(&held, &saved).unwrap();
        assert_eq!(
            largest_difference(&before, &fingerprint(&held).unwrap()),
            0.0
        );
        assert_eq!(held[0].to_vec2::<f32>().unwrap(), [[1.0, -2.0], [3.0, 4.0]]);
        assert_eq!(held[2].to_scalar::<f32>().unwrap(), 2.5);
        let now: Vec<usize> = held.iter().map(super::super::inputs::cpu_address).collect();
        assert_eq!(at, now);
        // One value off by 1e-4 of the buffer is seen; rounding (1e-7) is not.
        let off = |x: f32| {
            let t = Tensor::new(&[1000f32, x], &dev).unwrap();
            fingerprint(&[t]).unwrap()
        };
        assert!(largest_difference(&off(1.0), &off(1.1)) > REPLAY_TOLERANCE);
        assert!(largest_difference(&off(1.0), &off(1.0001)) <= REPLAY_TOLERANCE);
    }

    /// Off the GPU a step graph runs its step each time, and says it does not replay.
    #[test]
    fn off_the_gpu_the_step_runs_as_it_is() {
        let ran = std::cell::Cell::new(0);
        let mut graph = StepGraph::new("update", true);
        for _ in 0..2 * WARM_STEPS + 2 {
            let region = || {
                ran.set(ran.get() + 1);
                Ok(())
            };
            graph.run(&Device::Cpu, true, &[], &region).unwrap();
        }
        assert_eq!(ran.get(), 2 * WARM_STEPS + 2);
        assert!(!graph.replays() && !capturing());
    }
}
