//! What a run needs in an accelerator's memory, estimated before anything is
//! allocated there, and checked against what the device has free: a population of P
//! members (a single run on a device is a population of one) keeps its members' replay
//! frames mirrored on the device, P networks with their target, gradients and optimizer
//! state, and an update's activations for P batches at once. The host's memory is
//! checked apart (`validate::MemoryEstimate`): the replays stay on the host too.

use anyhow::Result;
use normrl_agents::nn::Architecture;
use normrl_agents::replay::FrameEncoding;
use normrl_envs::ObservationSpace;

use crate::config::TrainConfig;

/// Bytes a population needs on its device, by what takes them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeviceEstimate {
    /// The members' replay frames mirrored as bytes (images and MinAtar's binary frames;
    /// float observations are not mirrored).
    pub mirror_bytes: u128,
    /// Online and target networks, gradients, two optimizer moments and the optimizer's
    /// temporaries: about six copies of every parameter, for every member.
    pub network_bytes: u128,
    /// One update's activations: the batches' observations as floats, every layer's
    /// outputs (and a convolution's unfolded patches) for the training forward and
    /// the target's, each kept for the backward with its gradient and a
    /// normalization's saved values.
    pub activation_bytes: u128,
}

/// Copies of each activation an update holds at its peak: the training forward's
/// output, a normalization's saved values, the backward's gradient, a temporary.
const ACTIVATION_COPIES: u128 = 4;

impl DeviceEstimate {
    pub fn of(config: &TrainConfig, space: &ObservationSpace, actions: usize, p: usize) -> Self {
        let p = p as u128;
        let obs_len: u128 = space.shape.iter().map(|&d| d as u128).product();
        let mirror_bytes = match FrameEncoding::of(space) {
            FrameEncoding::Float => 0,
            FrameEncoding::Bits | FrameEncoding::Bytes => {
                p * config.replay.capacity as u128 * obs_len
            }
        };
        let arch = &config.network.architecture;
        let outputs = super::validate::head_outputs(config, actions);
        let (params, per_sample) = sizes(arch, &space.shape, outputs);
        let network_bytes = p * params * 4 * 6;
        // Observations and next observations; CrossQ's joint forward trains on both,
        // the others keep the next observations' forward only until the targets.
        let rows = p * config.replay.batch_size as u128 * 2;
        let activation_bytes = rows * 4 * (obs_len + per_sample * ACTIVATION_COPIES);
        Self {
            mirror_bytes,
            network_bytes,
            activation_bytes,
        }
    }

    pub fn total(&self) -> u128 {
        self.mirror_bytes + self.network_bytes + self.activation_bytes
    }

    /// An error with the numbers when `members` members cannot fit in the `free`
    /// bytes of a device of `total` bytes.
    pub fn check(
        &self,
        config: &TrainConfig,
        members: usize,
        (free, total): (u64, u64),
    ) -> Result<()> {
        if self.total() <= u128::from(free) {
            return Ok(());
        }
        let [need, free, total, mirror, networks, activations] = [
            self.total(),
            u128::from(free),
            u128::from(total),
            self.mirror_bytes,
            self.network_bytes,
            self.activation_bytes,
        ]
        .map(super::validate::gib);
        let (capacity, batch) = (config.replay.capacity, config.replay.batch_size);
        anyhow::bail!(
            "{members} member(s) need about {need:.1} GiB of the device's memory and it has {free:.1} GiB free of {total:.1} GiB: the replay frames mirrored there take {mirror:.1} GiB (replay.capacity = {capacity} per member), the networks with their optimizer state {networks:.1} GiB, an update's activations {activations:.1} GiB (replay.batch_size = {batch}); lower run.population, replay.capacity or replay.batch_size"
        )
    }
}

/// The network's trainable values, and the values one sample's forward produces
/// (every layer's output, and a convolution's unfolded patches), computed without
/// overflow for any widths.
fn sizes(arch: &Architecture, obs_shape: &[usize], actions: usize) -> (u128, u128) {
    let mut shape: Vec<u128> = obs_shape.iter().map(|&d| d as u128).collect();
    let (mut params, mut values) = (0u128, 0u128);
    for &(c_out, k, stride) in arch.convolutions() {
        let [c_in, h, w] = shape[..] else {
            return (params, values);
        };
        let (c_out, k, stride) = (c_out as u128, k as u128, stride as u128);
        params += c_out * (c_in * k * k + 1);
        let out = |d: u128| d.saturating_sub(k) / stride + 1;
        let positions = out(h) * out(w);
        values += positions * (c_in * k * k + c_out);
        shape = vec![c_out, out(h), out(w)];
    }
    let mut width: u128 = shape.iter().product();
    for h in arch.dense_widths().into_iter().chain([actions]) {
        params += (width + 1) * h as u128;
        values += h as u128;
        width = h as u128;
    }
    (params, values)
}

/// Free and total bytes of `device`'s memory, where the device says (CUDA); `None` on
/// the CPU, whose memory `validate::MemoryEstimate` checks.
pub fn free_and_total(device: &candle_core::Device) -> Option<(u64, u64)> {
    match device {
        #[cfg(feature = "cuda")]
        candle_core::Device::Cuda(cuda) => {
            use candle_core::cuda_backend::cudarc::driver::result::mem_get_info;
            cuda.cuda_stream().context().bind_to_thread().ok()?;
            let (free, total) = mem_get_info().ok()?;
            Some((free as u64, total as u64))
        }
        _ => None,
    }
}

/// Refuses a run of `members` members of `config` whose estimate exceeds what its
/// device has free; nothing to check on the CPU.
pub fn check(config: &TrainConfig, members: usize) -> Result<()> {
    let spec = crate::config::parse_device_spec(&config.run.device)?;
    let device = crate::config::select_device(spec)?;
    let Some(memory) = free_and_total(&device) else {
        return Ok(());
    };
    let env = normrl_envs::make(&config.env.id)?;
    let space = env.observation_space();
    DeviceEstimate::of(config, &space, env.action_space().n, members).check(config, members, memory)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breakout(overrides: &[&str]) -> (TrainConfig, ObservationSpace, usize) {
        let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
        let path = std::path::Path::new("configs/minatar/breakout.toml");
        let config = TrainConfig::load(path, &overrides).unwrap();
        let env = normrl_envs::make(&config.env.id).unwrap();
        (config, env.observation_space(), env.action_space().n)
    }

    /// The P = 256 population on MinAtar Breakout (capacity 100,000 frames of
    /// 4x10x10 bytes): a 10 GB mirror; the networks and activations by hand.
    #[test]
    fn a_populations_device_memory_is_counted_by_what_takes_it() {
        let (config, space, actions) =
            breakout(&["replay.capacity=100000", "replay.batch_size=32"]);
        let e = DeviceEstimate::of(&config, &space, actions, 256);
        assert_eq!(e.mirror_bytes, 256 * 100_000 * 400);
        // Conv 4->16 3x3 (592), dense 1024->128 (131,200), 128->6 (774).
        let params = 592 + 131_200 + 774;
        assert_eq!(e.network_bytes, 256 * params * 4 * 6);
        // Per sample: 64 positions x (36 patch values + 16 outputs), 128, 6.
        let per_sample = 64 * 52 + 128 + 6;
        assert_eq!(
            e.activation_bytes,
            256 * 32 * 2 * 4 * (400 + per_sample * 4)
        );
        assert_eq!(
            e.total(),
            e.mirror_bytes + e.network_bytes + e.activation_bytes
        );
        // CartPole's float observations are not mirrored.
        let env = normrl_envs::make("classic/cartpole").unwrap();
        let cartpole = DeviceEstimate::of(&config, &env.observation_space(), 2, 256);
        assert_eq!(cartpole.mirror_bytes, 0);
    }

    /// A population that does not fit is refused with the numbers and what to lower; one
    /// that fits passes.
    #[test]
    fn a_population_beyond_the_devices_free_memory_is_refused_with_the_numbers() {
        let (config, space, actions) = breakout(&["replay.capacity=100000"]);
        let e = DeviceEstimate::of(&config, &space, actions, 256);
        let gib = 1u64 << 30;
        let err = e
            .check(&config, 256, (8 * gib, 141 * gib))
            .unwrap_err()
            .to_string();
        for part in [
            "256 member(s) need about 11.2 GiB",
            "frames mirrored there take 9.5 GiB",
            "8.0 GiB free of 141.0 GiB",
            "replay.capacity = 100000 per member",
            "lower run.population, replay.capacity or replay.batch_size",
        ] {
            assert!(err.contains(part), "{part:?} not in: {err}");
        }
        e.check(&config, 256, (100 * gib, 141 * gib)).unwrap();
    }

    /// A distributional head is `actions x atoms` wide, and both estimates count it:
    /// they counted `actions` alone, so 10^9 atoms passed them and aborted the
    /// allocator (now bounded in the config too).
    #[test]
    fn a_distributional_heads_atoms_are_counted() {
        let (plain, space, actions) = breakout(&[]);
        let (c51, ..) = breakout(&["dqn.loss=\"c51\"", "dqn.support.atoms=51"]);
        // The head 128 -> 6 x 51 instead of 128 -> 6: (128 + 1) x 6 x 50 more values.
        let more = 129 * 6 * 50 * 4 * 6;
        let host = |c| crate::config::validate::MemoryEstimate::of(c, &space, actions);
        assert_eq!(host(&c51).network_bytes - host(&plain).network_bytes, more);
        let device = |c| DeviceEstimate::of(c, &space, actions, 1);
        assert_eq!(
            device(&c51).network_bytes - device(&plain).network_bytes,
            more
        );
    }
}
