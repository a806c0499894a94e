//! `tangram simulate`: its options, and one run of the simulator on a built-in workload or a
//! trace, every policy side by side (the GPU, API and image workloads have their own
//! comparisons: `gpu_sim.rs`, `image_sim.rs`).

use crate::{errors, fair_sim, gpu_sim, image_sim, progress, report};
use anyhow::{bail, Context as _};
use serde_json::json;
use std::path::PathBuf;
use tangram_core::sim::{self, trace, AiCoding, Workload, WorkloadName};

#[derive(Debug, clap::Args)]
pub(crate) struct SimulateArgs {
    /// Built-in workload generator: ai-coding, bursty, mopd, deepsearch, swe-images or
    /// fairness.
    #[arg(long, conflicts_with = "trace")]
    pub(crate) workload: Option<String>,
    /// A JSON-lines trace, one trajectory per line (docs/SIMULATOR.md).
    #[arg(long)]
    pub(crate) trace: Option<PathBuf>,
    /// Policies, comma-separated; ratios are given to the first [default:
    /// tangram,static,fifo-dop-4,first-fit; swe-images leaves static out of it]
    #[arg(long)]
    pub(crate) policies: Option<String>,
    /// Trajectories in the batch (built-in workloads; `fairness` scales its scenarios'
    /// trajectories and cores by this over 1280).
    #[arg(long, default_value_t = 1280)]
    pub(crate) batch: usize,
    /// RL jobs sharing the cluster (built-in workloads); job k gets a share of the batch
    /// proportional to 2^-k.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub(crate) jobs: u32,
    /// Seed (built-in workloads).
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// Cluster file (JSON); the workload's default cluster otherwise.
    #[arg(long)]
    pub(crate) cluster: Option<PathBuf>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
    /// Elasticity models the scheduler sees: oracle (each action's true model), learned
    /// (fitted online per job and tool), or both (adds `tangram-learned` and `tangram-v2-learned` rows).
    #[arg(long, default_value = "both", value_parser = ["oracle", "learned", "both"])]
    pub(crate) elasticity: String,
    /// Where to write the picture (SVG).
    #[arg(long, default_value = "simulate.svg")]
    pub(crate) svg: PathBuf,
    /// GPU workloads: GPUs in the pooled (Evict-on-Execution) policies' pool; the static
    /// baseline keeps 4 per service.
    #[arg(long, default_value_t = 10)]
    pub(crate) gpus: u32,
    /// Cores each trajectory's sandbox holds under the `static` and `k8s` baselines (the paper's 4; a
    /// replayed trace of a small cluster wants what `tangram up --static-cores` gave).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) static_cores: u32,
    /// Median pod start of the `k8s` baseline, seconds (default: 1.6, docs/CALIBRATION.md).
    #[arg(long, default_value_t = tangram_core::sim::K8s::START_MS / 1e3)]
    pub(crate) pod_start_s: f64,
    /// GPU workloads: also run the first of `tangram` and `tangram-v2` listed at every pool
    /// size from 1 GPU up to the static baseline's, and report the fewest GPUs whose mean ACT is within 10% of static's.
    #[arg(long)]
    pub(crate) gpu_sweep: bool,
    /// swe-images: trajectories per task (one image per task).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) group: u32,
    /// swe-images: a node's image pull throughput, MB/s.
    #[arg(long, default_value_t = 100.0)]
    pub(crate) pull_mb_per_s: f64,
    /// swe-images: what one more sandbox per core costs against a pull, ms (the scheduler's
    /// `[images] load_ms`).
    #[arg(long, default_value_t = tangram_core::EngineConfig::default().image_load_ms)]
    pub(crate) image_load_ms: u64,
}

/// `tangram simulate`'s policies when `--policies` is not given.
pub(crate) const DEFAULT_POLICIES: &str = "tangram,static,fifo-dop-4,first-fit";

impl SimulateArgs {
    /// The policies `--policies` names, in order, blanks dropped ([`DEFAULT_POLICIES`] when
    /// it is not given).
    pub(crate) fn policy_names(&self) -> impl Iterator<Item = &str> {
        self.policies
            .as_deref()
            .unwrap_or(DEFAULT_POLICIES)
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
    }
}

pub(crate) fn simulate(args: SimulateArgs) -> anyhow::Result<()> {
    let mut notes = Vec::new();
    let (mut workload, label) = match (&args.workload, &args.trace) {
        (Some(w), None) => {
            match WorkloadName::parse(w).map_err(|e| errors::UsageError(e.to_string()))? {
                WorkloadName::AiCoding => (
                    AiCoding {
                        batch: args.batch,
                        seed: args.seed,
                        jobs: args.jobs as usize,
                    }
                    .generate(),
                    format!(
                        "ai-coding, batch {}, seed {}, {} job(s)",
                        args.batch, args.seed, args.jobs
                    ),
                ),
                WorkloadName::Bursty => (
                    sim::Bursty {
                        batch: args.batch,
                        seed: args.seed,
                    }
                    .generate(),
                    format!("bursty, batch {}, seed {}", args.batch, args.seed),
                ),
                WorkloadName::Mopd => return gpu_sim::mopd(&args),
                WorkloadName::DeepSearch => return gpu_sim::deepsearch(&args),
                WorkloadName::SweImages => return image_sim::swe_images(&args),
                WorkloadName::Fairness => return fair_sim::fairness(&args),
            }
        }
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            (
                Workload {
                    trajectories: trace::parse_trace(&text)?,
                    nodes: AiCoding::nodes(),
                    ..Default::default()
                },
                format!("trace {}", path.display()),
            )
        }
        _ => crate::usage!("give --workload NAME or --trace FILE"),
    };
    if let Some(path) = &args.cluster {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let (nodes, n) = trace::parse_cluster(&text)?;
        workload.nodes = nodes;
        if args.trace.is_none() {
            notes.extend(n);
        }
        if args.trace.is_some() {
            if let Ok((gpus, services)) = trace::parse_gpu_cluster(&text) {
                workload.gpus = gpus;
                workload.services = services.unwrap_or_default();
            }
            workload.providers = trace::parse_providers(&text)?;
        }
    }
    // Every service and provider a trace names must be declared.
    for t in &workload.trajectories {
        for st in &t.steps {
            match &st.action.call {
                sim::SimCall::Reward { service } if !workload.services.iter().any(|s| &s.name == service) => bail!(
                    "trajectory {} calls service {service:?}, which the cluster file does not declare (services: [{{\"name\", \"gpus\", \"restore_s\", \"slots\"}}] and nodes with \"gpu\")",
                    t.id
                ),
                sim::SimCall::Api { provider } if !workload.providers.iter().any(|p| &p.name == provider) => bail!(
                    "trajectory {} calls provider {provider:?}, which the cluster file does not declare (providers: [{{\"name\", \"rate\", \"burst\", \"concurrency\"}}])",
                    t.id
                ),
                _ => {}
            }
        }
    }
    let names: Vec<&str> = args.policy_names().collect();
    let mut policies: Vec<Box<dyn sim::Simulated>> = Vec::new();
    for n in &names {
        if *n == tangram_core::policies::Static::NAME {
            policies.push(Box::new(tangram_core::policies::Static {
                cores: args.static_cores,
            }));
            continue;
        }
        if *n == sim::K8s::NAME {
            if !(args.pod_start_s.is_finite() && args.pod_start_s >= 0.0) {
                crate::usage!("--pod-start-s must be a number of seconds, 0 or more");
            }
            policies.push(Box::new(sim::K8s {
                cores: args.static_cores,
                start_ms: args.pod_start_s * 1e3,
            }));
            continue;
        }
        match sim::by_name(n) {
            Some(p) => policies.push(p),
            None => crate::usage!(
                "unknown policy {n:?}; available: {}",
                sim::names().collect::<Vec<_>>().join(", ")
            ),
        }
    }
    if policies.is_empty() {
        crate::usage!("--policies is empty");
    }
    let mut reports = Vec::new();
    let spinner = progress::Spinner::start("simulating");
    for (i, p) in policies.iter().enumerate() {
        spinner.set_message(format!("simulating {}", p.label()));
        spinner.set_count(i as u64, policies.len() as u64);
        if args.elasticity != "learned" {
            reports.push(sim::simulate_with(
                &workload,
                p.as_ref(),
                sim::Elasticity::Oracle,
            ));
        }
        if args.elasticity != "oracle" && matches!(p.label(), "tangram" | "tangram-v2") {
            let mut r = sim::simulate_with(&workload, p.as_ref(), sim::Elasticity::Learned);
            r.policy = format!("{}-learned", p.label());
            reports.push(r);
        } else if args.elasticity == "learned" {
            reports.push(sim::simulate_with(
                &workload,
                p.as_ref(),
                sim::Elasticity::Learned,
            ));
        }
    }
    spinner.finish();
    let sums: Vec<_> = reports.iter().map(|r| r.summary()).collect();
    let expected = sim::actions_in(&workload);
    for s in &sums {
        if s.actions < expected {
            notes.push(format!(
                "{} ran {} of the {expected} actions: the rest never fitted (a demand larger than any node; for static, see --static-cores)",
                s.name, s.actions
            ));
        }
    }
    let base = &sums[0];
    let ratio = report::ratio;
    report::write_svg(&args.svg, &label, &reports)?;
    if args.json {
        let policies: Vec<_> = sums.iter().map(|s| report::policy_json(s, base)).collect();
        let out = json!({
            "workload": label,
            "nodes": workload.nodes.len(),
            "cores": workload.nodes.iter().map(|&c| c as u64).sum::<u64>(),
            "trajectories": workload.trajectories.len(),
            "policies": policies,
            "svg": args.svg.display().to_string(),
            "notes": notes,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "{label}: {} trajectories, {} actions, {} nodes / {} cores",
            workload.trajectories.len(),
            sim::actions_in(&workload),
            workload.nodes.len(),
            workload.nodes.iter().map(|&c| c as u64).sum::<u64>()
        );
        let mut t = crate::table::new([
            "policy",
            "mean ACT",
            "p50",
            "p99",
            "queue",
            "exec",
            "step",
            "reserved",
            "used",
            "ACT ratio",
        ]);
        for s in &sums {
            let secs = |v: f64| format!("{v:.3}s");
            t.add_row([
                s.name.to_string(),
                secs(s.mean_act_s),
                secs(s.p50_act_s),
                secs(s.p99_act_s),
                secs(s.mean_queue_s),
                secs(s.mean_exec_s),
                format!("{:.1}s", s.step_time_s),
                format!("{:.0}cs", s.reserved_cpu_s),
                format!("{:.0}cs", s.used_cpu_s),
                format!("{:.2}x", ratio(s.mean_act_s, base.mean_act_s)),
            ]);
        }
        print!("{}", crate::table::render(&t, ""));
        println!(
            "(cs = core-seconds; ACT ratio = mean ACT over {}'s)",
            base.name
        );
        for n in &notes {
            println!("note: {n}");
        }
        println!("picture: {}", args.svg.display());
    }
    Ok(())
}
