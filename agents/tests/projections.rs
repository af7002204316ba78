//! Weight norm's descendants hold what they project, after every update: projected
//! weight norm's directions and hyperspherical layers' rows at norm 1 per unit, NaP's
//! weights at their initial norm and its layer norms' gain and offset at `sqrt(d)`,
//! for Adam and centered RMSprop, single agents (an MLP on the host path, MinAtar's
//! CNN on the graph) and a population. Projected weight norm computes weight norm's
//! function; hyperspherical features lie on the unit sphere.

mod common;

use candle_core::{Device, Tensor};
use normrl_agents::dqn::{AgentConfig, Dqn, DqnConfig};
use normrl_agents::nn::{
    Activation, LinearMap, NormConfig, NormKind, Pass, QNetwork, QNetworkConfig, SphereHead,
    WeightRule,
};
use normrl_agents::optim::{OptimizerConfig, OptimizerKind};
use normrl_agents::population::PopulationDqn;

const ACTIONS: usize = 3;
/// The three methods, hyperspherical layers with each head.
fn projected() -> Vec<NormConfig> {
    let of = |kind| NormConfig::from(kind);
    let scaled = NormConfig {
        sphere_head: SphereHead::Scaled,
        ..of(NormKind::Hyperspherical)
    };
    // CrossQ with weight norm's and XQC's layers, with the output layer projected too.
    let crossq = NormConfig {
        weight: WeightRule::UnitRows,
        activation: Activation::BatchNorm,
        sphere_head: SphereHead::UnitRows,
        ..NormConfig::default()
    };
    let kinds = [
        NormKind::WnProjected,
        NormKind::Nap,
        NormKind::Hyperspherical,
    ];
    kinds.into_iter().map(of).chain([scaled, crossq]).collect()
}

fn shapes() -> [(QNetworkConfig, Vec<usize>, bool); 2] {
    [
        (QNetworkConfig::mlp(vec![24, 16]), vec![5], false),
        (QNetworkConfig::minatar_cnn(), vec![4, 10, 10], true),
    ]
}

fn agent(
    network: &QNetworkConfig,
    obs: &[usize],
    kind: NormKind,
    opt: OptimizerKind,
    seed: u64,
) -> Dqn {
    let norm = NormConfig::from(kind);
    agent_with(network, obs, &norm, opt, seed)
}

fn agent_with(
    network: &QNetworkConfig,
    obs: &[usize],
    norm: &NormConfig,
    opt: OptimizerKind,
    seed: u64,
) -> Dqn {
    let optimizer = OptimizerConfig {
        kind: opt,
        lr: 1e-2,
        ..Default::default()
    };
    let config = AgentConfig {
        network,
        norm,
        optimizer: &optimizer,
        dqn: &DqnConfig::default(),
    };
    Dqn::new(config, obs, ACTIONS, seed, &Device::Cpu).unwrap()
}

/// Each leading index's norm of `t` over the axes after `from`.
fn norms(t: &Tensor, from: usize) -> Vec<f32> {
    let rows = t.flatten_from(from).unwrap();
    let n = rows.sqr().unwrap().sum(from).unwrap().sqrt().unwrap();
    n.flatten_all().unwrap().to_vec1().unwrap()
}

/// Every projected quantity of one network's (or, with `lead = 1`, a population's)
/// variables has the norm it should, to f32 rounding.
fn assert_projected(norm: &NormConfig, vars: &[(String, Tensor)], lead: usize, what: &str) {
    let weight = norm.weight;
    let get = |name: &str| vars.iter().find(|(n, _)| n == name).map(|(_, t)| t.clone());
    let close = |got: &[f32], want: &[f32], name: &str| {
        for (g, w) in got.iter().zip(want) {
            assert!(
                (g - w).abs() <= 2e-6 * w.max(1.0),
                "{what}: {name}: norm {g}, not {w}"
            );
        }
    };
    let mut checked = 0;
    for (name, t) in vars {
        let unit_rows = match weight {
            WeightRule::Projected => name.ends_with(".v"),
            WeightRule::UnitRows => {
                let head = name.starts_with("head.");
                name.ends_with(".weight") && (!head || norm.sphere_head != SphereHead::Linear)
            }
            _ => false,
        };
        if unit_rows {
            let n = norms(t, lead + 1);
            close(&n, &vec![1.0; n.len()], name);
            checked += 1;
        }
        if weight == WeightRule::FixedNorm && name.ends_with(".rho") {
            let layer = name.trim_end_matches(".rho");
            let w = get(&format!("{layer}.weight")).unwrap();
            close(
                &norms(&w, lead),
                &t.flatten_all().unwrap().to_vec1().unwrap(),
                name,
            );
            let gamma = get(&format!("{layer}.ln.gamma")).unwrap();
            let beta = get(&format!("{layer}.ln.beta")).unwrap();
            let joint = Tensor::cat(
                &[
                    gamma.flatten_from(lead).unwrap(),
                    beta.flatten_from(lead).unwrap(),
                ],
                lead,
            )
            .unwrap();
            let d = (gamma.elem_count() / gamma.dims()[..lead].iter().product::<usize>()) as f32;
            let n = norms(&joint, lead);
            close(&n, &vec![d.sqrt(); n.len()], &format!("{layer}.ln"));
            checked += 1;
        }
    }
    assert!(
        checked >= 2,
        "{what}: only {checked} projected variables found"
    );
}

fn single_vars(net: &QNetwork) -> Vec<(String, Tensor)> {
    let params = net.store().params().iter();
    params
        .map(|p| (p.name.clone(), p.var.as_tensor().clone()))
        .collect()
}

#[test]
fn every_update_ends_on_the_projection() {
    for (network, obs, binary) in shapes() {
        let n: usize = obs.iter().product();
        for norm in projected() {
            for opt in [OptimizerKind::Adam, OptimizerKind::Rmsprop] {
                let (method, head) = (norm.name(), norm.sphere_head);
                let what = format!(
                    "{method} ({head:?} head) {opt:?} {:?}",
                    network.architecture
                );
                let mut alone = agent_with(&network, &obs, &norm, opt, 1);
                let pair: Vec<Dqn> = [2, 3]
                    .iter()
                    .map(|&s| agent_with(&network, &obs, &norm, opt, s))
                    .collect();
                let mut population =
                    PopulationDqn::from_agents(&pair.iter().collect::<Vec<_>>()).unwrap();
                assert_projected(
                    &norm,
                    &single_vars(alone.online()),
                    0,
                    &format!("{what} at init"),
                );
                for step in 0..8 {
                    let b = common::batch(16, n, binary, 0, step, ACTIONS);
                    alone.update(&b).unwrap();
                    assert_projected(
                        &norm,
                        &single_vars(alone.online()),
                        0,
                        &format!("{what} update {step}"),
                    );
                    let batches: Vec<_> = (1..3)
                        .map(|a| common::batch(16, n, binary, a, step, ACTIONS))
                        .collect();
                    population.update(&batches).unwrap();
                    let vars = population.online().vars_and_buffers();
                    let vars: Vec<_> = vars
                        .iter()
                        .map(|(n, v)| (n.to_string(), v.as_tensor().clone()))
                        .collect();
                    assert_projected(&norm, &vars, 1, &format!("{what} population update {step}"));
                }
            }
        }
    }
}

/// With the same seed, projected weight norm starts from weight norm's `g` and
/// direction (its `v` only rescaled): the same Q-values, on the MLP and the CNN.
#[test]
fn projected_weight_norm_computes_weight_norms_function() {
    for (network, obs, binary) in shapes() {
        let n: usize = obs.iter().product();
        let plain = agent(&network, &obs, NormKind::WeightNorm, OptimizerKind::Adam, 4);
        let projected = agent(
            &network,
            &obs,
            NormKind::WnProjected,
            OptimizerKind::Adam,
            4,
        );
        let b = common::batch(8, n, binary, 0, 0, ACTIONS);
        let mut dims = vec![8];
        dims.extend(&obs);
        let x = Tensor::from_vec(b.obs.clone(), dims, &Device::Cpu).unwrap();
        let q = |d: &Dqn| d.online().forward(&x, Pass::EVAL).unwrap();
        let err = common::max_rel_err(&q(&projected), &q(&plain));
        assert!(
            err < 1e-5,
            "{:?}: Q-values apart by {err}",
            network.architecture
        );
        let v = projected
            .online()
            .store()
            .get("fc0.v")
            .unwrap()
            .var
            .as_tensor()
            .clone();
        assert!(norms(&v, 1).iter().all(|&n| (n - 1.0).abs() < 1e-6));
    }
}

/// Every hidden layer's output has norm 1 per sample (per position of a feature map,
/// over its channels), after updates.
#[test]
fn hyperspherical_features_lie_on_the_unit_sphere() {
    for (network, obs, binary) in shapes() {
        let n: usize = obs.iter().product();
        let mut dqn = agent(
            &network,
            &obs,
            NormKind::Hyperspherical,
            OptimizerKind::Adam,
            5,
        );
        for step in 0..5 {
            dqn.update(&common::batch(16, n, binary, 0, step, ACTIONS))
                .unwrap();
        }
        let b = common::batch(8, n, binary, 0, 99, ACTIONS);
        let mut dims = vec![8];
        dims.extend(&obs);
        let mut h = Tensor::from_vec(b.obs.clone(), dims, &Device::Cpu).unwrap();
        let layers: Vec<_> = dqn.online().layers().collect();
        for (i, layer) in layers.iter().enumerate() {
            if i > 0 && h.rank() == 4 && matches!(layer.kernel(), LinearMap::Linear { .. }) {
                h = h.flatten_from(1).unwrap();
            }
            h = layer.forward(&h, Pass::EVAL).unwrap();
            if i + 1 == layers.len() {
                break;
            }
            let per_sample = h.sqr().unwrap().sum_keepdim(1).unwrap().sqrt().unwrap();
            let values = per_sample.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            // A position whose every channel is 0 after the ReLU (an empty patch of a
            // binary frame) stays 0: `x / max(||x||, 1e-8)`.
            let on_sphere = values.iter().filter(|&&v| (v - 1.0).abs() < 1e-5).count();
            let zero = values.iter().filter(|&&v| v == 0.0).count();
            assert!(
                on_sphere + zero == values.len() && on_sphere * 2 > values.len(),
                "{}: feature norms {values:?}",
                layer.name()
            );
        }
    }
}
