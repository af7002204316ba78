//! `normrl bench population`: P agents' updates as one population update against P
//! separate agents' updates, and the population update's graph size (its operations,
//! which do not grow with P), for MLP Q-networks with the methods populations support.

use anyhow::Result;
use candle_core::Device;
use normrl_agents::dqn::{Dqn, DqnConfig};
use normrl_agents::nn::{NormConfig, NormKind, QNetworkConfig};
use normrl_agents::optim::OptimizerConfig;
use normrl_agents::population::{PopulationDqn, PopulationNet};
use normrl_agents::replay::Batch;
use rand::SeedableRng;
use rand_xoshiro::Xoshiro256PlusPlus;

use crate::bench_cmd::{random_batch, time_interleaved, Row};

const POPULATIONS: [usize; 4] = [1, 4, 16, 64];
const OBS: usize = 4;
const ACTIONS: usize = 2;

/// `P` single agents (seeds 0..P) of `kind`, CartPole-sized MLP 4-64-64-2.
fn agents(kind: NormKind, p: usize) -> Result<Vec<Dqn>> {
    let norm = NormConfig {
        kind,
        ..Default::default()
    };
    let net = QNetworkConfig::mlp(vec![64, 64]);
    let (optimizer, dqn) = (OptimizerConfig::default(), DqnConfig::default());
    (0..p as u64)
        .map(|seed| {
            Dqn::new(
                &net,
                &norm,
                &optimizer,
                &dqn,
                &[OBS],
                ACTIONS,
                seed,
                &Device::Cpu,
            )
            .map_err(Into::into)
        })
        .collect()
}

/// Every row for one method, batch size and population size.
fn case_rows(kind: NormKind, batch: usize, p: usize, iters: usize) -> Result<Vec<Row>> {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(0);
    let batches: Vec<Batch> = (0..p)
        .map(|_| random_batch(batch, OBS, ACTIONS, false, &mut rng))
        .collect();
    let mut separate = agents(kind, p)?;
    let nets: Vec<_> = separate.iter().map(Dqn::online).collect();
    let stacked = PopulationNet::stack(&nets)?;
    let mut population =
        PopulationDqn::new(stacked, DqnConfig::default(), OptimizerConfig::default())?;
    let nodes = population.loss_graph_nodes(&batches)?;
    let timings = {
        let batches = &batches;
        let mut fs: Vec<Box<dyn FnMut() -> Result<()> + '_>> = vec![
            Box::new(|| population.update(batches).map(|_| ()).map_err(Into::into)),
            Box::new(|| {
                for (agent, b) in separate.iter_mut().zip(batches) {
                    agent.update(b)?;
                }
                Ok(())
            }),
        ];
        time_interleaved(iters, &Device::Cpu, &mut fs)?
    };
    let case = format!("mlp 4-64-64-2 b{batch} P={p}");
    let mut rows = vec![];
    for (name, t) in ["population", "separate"].iter().zip(&timings) {
        rows.push(Row {
            bench: format!("{name} update {kind}"),
            case: case.clone(),
            value: t.median,
            min: Some(t.min),
            unit: "us",
        });
        rows.push(Row {
            bench: format!("{name} agent-updates/s"),
            case: case.clone(),
            value: p as f64 / t.min * 1e6,
            min: None,
            unit: "1/s",
        });
    }
    rows.push(Row {
        bench: format!("population graph {kind}"),
        case,
        value: nodes as f64,
        min: None,
        unit: "nodes",
    });
    Ok(rows)
}

/// The population rows: none, weight norm, layer norm and batch norm, batch 4 and 32,
/// P = 1 to 64.
pub fn rows(iters: usize) -> Result<Vec<Row>> {
    let mut rows = vec![];
    let kinds = [
        NormKind::None,
        NormKind::WeightNorm,
        NormKind::LayerNorm,
        NormKind::BatchNorm,
    ];
    for kind in kinds {
        for batch in [4, 32] {
            for p in POPULATIONS {
                // Fewer rounds for the large populations: a round is P updates.
                let rounds = (iters / p.max(1)).max(10);
                rows.extend(case_rows(kind, batch, p, rounds)?);
            }
        }
    }
    Ok(rows)
}
