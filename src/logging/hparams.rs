//! TensorBoard's HParams dashboard: each run writes its hyperparameters when it starts
//! (`_hparams_/session_start_info`) and its status when it ends
//! (`_hparams_/session_end_info`); a comparison writes the experiment, its axes with
//! their values and the metrics (`_hparams_/experiment`), at the root of its runs. Seeds
//! of one configuration share a group name, so the dashboard groups them.

use std::collections::BTreeMap;

use normrl_agents::dqn::TargetUpdate;
use normrl_agents::nn::BnStats;
use normrl_agents::replay::Sampler;
use protobuf::well_known_types::{ListValue, Value};
use protobuf::{Message, RepeatedField};
use tensorboard_proto::api::{
    DataType, DatasetType, Experiment, HParamInfo, MetricInfo, MetricName, Status,
};
use tensorboard_proto::plugin_hparams::{HParamsPluginData, SessionEndInfo, SessionStartInfo};

use crate::config::TrainConfig;

pub const EXPERIMENT_TAG: &str = "_hparams_/experiment";
pub const SESSION_START_TAG: &str = "_hparams_/session_start_info";
pub const SESSION_END_TAG: &str = "_hparams_/session_end_info";

/// The metrics the dashboard shows next to the hyperparameters.
pub const METRICS: [&str; 3] = [
    "eval/episodic_return",
    "charts/episodic_return",
    "losses/td_loss",
];

/// One hyperparameter's value: a number or a text.
#[derive(Debug, Clone, PartialEq, PartialOrd)]
pub enum HValue {
    Number(f64),
    Text(String),
}

impl HValue {
    fn proto(&self) -> Value {
        let mut v = Value::new();
        match self {
            HValue::Number(x) => v.set_number_value(*x),
            HValue::Text(s) => v.set_string_value(s.clone()),
        }
        v
    }

    fn label(&self) -> String {
        match self {
            HValue::Number(x) => format!("{x}"),
            HValue::Text(s) => s.clone(),
        }
    }
}

/// The hyperparameters of a run that the dashboard lists (the seed is not one: seeds
/// are repeats of one configuration).
pub fn of(config: &TrainConfig) -> BTreeMap<&'static str, HValue> {
    let sampler = match config.replay.sampler {
        Sampler::Recent { window } => format!("recent(window={window})"),
        s => s.name().to_string(),
    };
    let text = |s: &str| HValue::Text(s.to_string());
    let number = |x: f64| HValue::Number(x);
    let target = match config.dqn.target_update {
        TargetUpdate::Hard { every } => format!("hard(every={every})"),
        TargetUpdate::Polyak { tau } => format!("polyak(tau={tau})"),
        TargetUpdate::None => "none".into(),
    };
    // BnStats's config names: "train" (batch statistics) or "eval" (running ones).
    let mode = |m: BnStats| text(if m == BnStats::Batch { "train" } else { "eval" });
    let dqn = &config.dqn;
    let loss = match dqn.loss.is_distributional() {
        false => config_name(&dqn.loss),
        true => {
            let s = &dqn.support;
            let support = format!("{} on [{}, {}]", s.atoms, s.v_min, s.v_max);
            format!("{}({support})", config_name(&dqn.loss))
        }
    };
    BTreeMap::from([
        ("target_update", HValue::Text(target)),
        ("loss", HValue::Text(loss)),
        ("reward_scale", text(&config_name(&dqn.reward_scale))),
        ("joint_forward", text(&dqn.joint_forward.to_string())),
        ("double_dqn", text(&dqn.double_dqn.to_string())),
        ("online_bn_mode", mode(dqn.online_bn_mode)),
        ("target_bn_mode", mode(dqn.target_bn_mode)),
        ("acting_bn_mode", mode(dqn.acting_bn_mode)),
        ("env", text(&config.env.id)),
        ("norm", text(&config.norm.name())),
        ("batch_size", number(config.replay.batch_size as f64)),
        ("sampler", HValue::Text(sampler)),
        ("replay_capacity", number(config.replay.capacity as f64)),
        ("learning_rate", number(config.optimizer.lr)),
        (
            "optimizer",
            text(&format!("{:?}", config.optimizer.kind).to_lowercase()),
        ),
        ("g_lr_scale", number(config.norm.g_lr_scale)),
        ("gamma", number(config.dqn.gamma)),
        ("total_steps", number(config.run.total_steps as f64)),
    ])
}

/// A config value's name as the config file writes it (`"c51"`, `"running_return"`).
fn config_name<T: serde::Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        other => format!("{other:?}"),
    }
}

fn plugin_data(fill: impl FnOnce(&mut HParamsPluginData)) -> Vec<u8> {
    let mut data = HParamsPluginData::new();
    data.set_version(0);
    fill(&mut data);
    data.write_to_bytes().expect("hparams data encodes")
}

/// `session_start_info` content for `config`, grouped with its other seeds.
pub fn session_start(config: &TrainConfig, start_secs: f64) -> Vec<u8> {
    let hparams = of(config);
    let mut info = SessionStartInfo::new();
    let group: Vec<String> = hparams
        .iter()
        .map(|(k, v)| format!("{k}={}", v.label()))
        .collect();
    info.set_group_name(group.join(","));
    info.set_start_time_secs(start_secs);
    for (k, v) in &hparams {
        info.mut_hparams().insert(k.to_string(), v.proto());
    }
    plugin_data(|d| d.set_session_start_info(info))
}

/// `session_end_info` content: success, or failure for a diverged run.
pub fn session_end(success: bool, end_secs: f64) -> Vec<u8> {
    let mut info = SessionEndInfo::new();
    info.set_status(if success {
        Status::STATUS_SUCCESS
    } else {
        Status::STATUS_FAILURE
    });
    info.set_end_time_secs(end_secs);
    plugin_data(|d| d.set_session_end_info(info))
}

/// `experiment` content for a comparison's runs: every hyperparameter with the values
/// the runs take, and the metrics.
pub fn experiment(name: &str, configs: &[TrainConfig], created_secs: f64) -> Vec<u8> {
    let mut values: BTreeMap<&str, Vec<HValue>> = BTreeMap::new();
    for config in configs {
        for (k, v) in of(config) {
            let list = values.entry(k).or_default();
            if !list.contains(&v) {
                list.push(v);
            }
        }
    }
    let infos = values.into_iter().map(|(name, mut vs)| {
        vs.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
        let mut info = HParamInfo::new();
        info.set_name(name.to_string());
        info.set_field_type(match vs.first() {
            Some(HValue::Number(_)) => DataType::DATA_TYPE_FLOAT64,
            _ => DataType::DATA_TYPE_STRING,
        });
        let mut domain = ListValue::new();
        domain.set_values(RepeatedField::from_vec(
            vs.iter().map(HValue::proto).collect(),
        ));
        info.set_domain_discrete(domain);
        info
    });
    let metrics = METRICS.iter().map(|tag| {
        let mut metric_name = MetricName::new();
        metric_name.set_tag(tag.to_string());
        let mut info = MetricInfo::new();
        info.set_name(metric_name);
        info.set_dataset_type(DatasetType::DATASET_UNKNOWN);
        info
    });
    let mut experiment = Experiment::new();
    experiment.set_name(name.to_string());
    experiment.set_time_created_secs(created_secs);
    experiment.set_hparam_infos(RepeatedField::from_vec(infos.collect()));
    experiment.set_metric_infos(RepeatedField::from_vec(metrics.collect()));
    plugin_data(|d| d.set_experiment(experiment))
}
