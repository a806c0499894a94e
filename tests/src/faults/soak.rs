//! The soak: the fault fleet (every component a process of its own, real sandboxes, the
//! reference replica, the provider stand-in) under a steady load for a long time, sampled
//! as it goes. Rollouts come and go (each lane opens a sandbox, runs its steps of exec with a
//! file of a few KiB, reward and api, closes it, and starts the next trajectory), so
//! sandboxes are opened and closed throughout. Reported: each process's RSS over time, the
//! streams' bytes and messages over time (the backlog and the history), refusals, and at
//! the end every acknowledged action classified ok, lost or duplicated (as the fault suite
//! does), then nothing left running, booked or leaked.

use super::check::{self, Report};
use super::{fleet, Fleet, Workload};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;
use tangram_shared::subject;
use tokio::time::Instant;

/// What a soak runs.
#[derive(Debug, Clone)]
pub struct SoakConfig {
    /// How long the load runs (the drain after it is not counted).
    pub duration: Duration,
    /// Rollouts at once.
    pub lanes: usize,
    /// Steps (exec, reward, api) per trajectory.
    pub steps: usize,
    /// Bytes of the file each exec carries.
    pub file_bytes: usize,
    /// How often the processes and streams are read.
    pub sample_every: Duration,
    /// When set, the history stream is shrunk to this many bytes, so that it wraps many
    /// times in a short run.
    pub history_bytes: Option<i64>,
    /// When set, the backlog streams are shrunk to this many bytes. JetStream removes a
    /// processed message from a work queue that a stream sources at once only when the
    /// source has copied it already, else in a later sweep, so the backlog also holds some
    /// processed work (up to about 30 s of it seen): a limit must hold that much at the
    /// soak's rate, or publishes are refused.
    pub backlog_bytes: Option<i64>,
    /// Where the picture goes, if anywhere.
    pub picture: Option<PathBuf>,
    /// Publishes a second across all lanes, if paced; else as fast as the lanes go.
    pub rate: Option<f64>,
    /// Sandboxes on the `noop` runtime: their execs leave no mark, so only their results
    /// are counted; rewards and api calls stay real. For rates that real containers on a
    /// small machine cannot reach.
    pub noop_sandboxes: bool,
}

/// One reading.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Sample {
    /// Seconds since the load started.
    pub t_s: f64,
    /// Resident memory of each process, MiB.
    pub rss_mib: BTreeMap<String, f64>,
    /// Bytes each stream holds.
    pub stream_bytes: BTreeMap<String, u64>,
    /// Messages each stream holds.
    pub stream_messages: BTreeMap<String, u64>,
    /// Results come so far.
    pub results: usize,
}

/// What a soak found.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SoakReport {
    /// `docker` or `noop`: what ran the sandboxes.
    pub sandboxes: &'static str,
    /// Minutes the load ran.
    pub load_minutes: f64,
    /// ok, lost, duplicated by kind.
    pub report: Report,
    /// Every reading.
    pub samples: Vec<Sample>,
    /// RSS growth of each process over the last half of the run, as a fraction (0.05 is 5%).
    pub rss_growth_last_half: BTreeMap<String, f64>,
    /// Publishes refused by a full backlog.
    pub refusals: usize,
    /// Actions answered per second over the load.
    pub actions_per_s: f64,
    /// How many times over the history's bytes passed through it (messages it took, by
    /// its last sequence, over the messages it holds at the end).
    pub history_turnovers: f64,
    /// After the drain: actions the scheduler still counted running, cores and memory
    /// still booked on any worker, sandboxes still open.
    pub left_running: usize,
    /// Cores still booked.
    pub left_cores: u32,
    /// Memory still booked, MiB.
    pub left_mem_mb: u64,
    /// Sandboxes the scheduler still listed.
    pub left_sandboxes: usize,
    /// Containers of the fleet's workers left after they stopped.
    pub leaked_containers: usize,
}

impl SoakReport {
    /// Whether the soak met its bar: nothing lost or duplicated, no refusal, nothing left
    /// behind, and no Tangram process grew by more than `max_growth` over the last half.
    /// (nats-server's memory follows what its streams hold, and the results stream is a
    /// 7-day window that fills for as long as a soak runs: it is reported, not judged.)
    pub fn passed(&self, max_growth: f64) -> bool {
        self.report.clean()
            && self.refusals == 0
            && self.left_running == 0
            && self.left_cores == 0
            && self.left_sandboxes == 0
            && self.leaked_containers == 0
            && self
                .rss_growth_last_half
                .iter()
                .filter(|(p, _)| p.as_str() != NATS_SERVER)
                .all(|(_, g)| *g <= max_growth)
    }

    /// A readable table.
    pub fn table(&self) -> String {
        let mut out = format!(
            "soak: {:.1} min, {:.1} actions/s, {} sandboxes, {} refusals, history turned over {:.1} times\n",
            self.load_minutes,
            self.actions_per_s,
            self.sandboxes,
            self.refusals,
            self.history_turnovers
        );
        out.push_str("process            rss start MiB  rss end MiB  growth over last half\n");
        let (first, last) = (self.samples.first(), self.samples.last());
        for (p, g) in &self.rss_growth_last_half {
            let at = |s: Option<&Sample>| s.and_then(|s| s.rss_mib.get(p)).copied();
            out.push_str(&format!(
                "{p:<18} {:>13.1}  {:>11.1}  {:>+20.1}%\n",
                at(first).unwrap_or(0.0),
                at(last).unwrap_or(0.0),
                g * 100.0
            ));
        }
        let t = &self.report.total;
        out.push_str(&format!(
            "actions: {} acknowledged, {} ok, {} lost, {} duplicated\n",
            t.acked, t.ok, t.lost, t.duplicated
        ));
        out.push_str(&format!(
            "after: {} running, {} cores and {} MiB booked, {} sandboxes, {} containers leaked\n",
            self.left_running,
            self.left_cores,
            self.left_mem_mb,
            self.left_sandboxes,
            self.leaked_containers
        ));
        out
    }
}

/// nats-server's name among the processes.
pub const NATS_SERVER: &str = "nats-server";

const STREAMS: [&str; 4] = [
    subject::ACTIONS_STREAM,
    subject::DISPATCH_STREAM,
    subject::HISTORY_STREAM,
    subject::RESULTS_STREAM,
];

/// Runs a soak on a fresh fleet with one scheduler.
pub async fn run(cfg: SoakConfig) -> anyhow::Result<SoakReport> {
    let options = fleet::FleetOptions {
        noop_sandboxes: cfg.noop_sandboxes,
        // Every action's path logged at debug is most of the work at hundreds a second.
        quiet_logs: cfg.rate.is_some_and(|r| r > 100.0),
    };
    let mut fleet = Fleet::start_with("soak", options).await?;
    fleet.start_scheduler()?;
    let job = "soak";
    let client = crate::Client::connect(&fleet.nats.url(), job).await?;
    // An operator's edit, as `nats stream edit` would make it.
    for (name, bytes) in [
        (subject::ACTIONS_STREAM, cfg.backlog_bytes),
        (subject::DISPATCH_STREAM, cfg.backlog_bytes),
        (subject::HISTORY_STREAM, cfg.history_bytes),
    ] {
        if let Some(bytes) = bytes {
            let mut s = client.js.get_stream(name).await?;
            let mut c = s.info().await?.config.clone();
            c.max_bytes = bytes;
            client.js.update_stream(c).await?;
        }
    }
    let workers = fleet.worker_ids();
    let ids: Vec<&str> = workers.iter().map(String::as_str).collect();
    client
        .wait_for_workers(&ids, Duration::from_secs(60))
        .await?;
    client
        .wait_for_scheduler_to_know(&ids, Duration::from_secs(60))
        .await?;

    let started = Instant::now();
    let until = started + cfg.duration;
    let workload = Workload::start_soak(
        &fleet.nats.url(),
        job,
        cfg.lanes,
        cfg.steps,
        cfg.file_bytes,
        cfg.rate,
        until,
    )
    .await?;
    let mut samples = Vec::new();
    while Instant::now() < until {
        samples.push(sample(&fleet, &client, started, workload.done()).await?);
        tokio::time::sleep(
            cfg.sample_every
                .min(until.saturating_duration_since(Instant::now())),
        )
        .await;
    }
    samples.push(sample(&fleet, &client, started, workload.done()).await?);
    let load_s = started.elapsed().as_secs_f64();
    let answered = workload.done();
    let refusals = workload.refused();
    let finished = workload.finish(Duration::from_secs(600)).await?;
    let marks = fleet.effects_log();
    let effects = check::Effects::read(
        (!cfg.noop_sandboxes).then_some(marks.as_path()),
        &fleet.replica_log(),
        fleet.api.seen().into_iter().map(|s| s.target),
    );
    let mut report = check::classify("soak", &effects, &client, finished.submitted).await?;
    if !report.clean() {
        report.evidence = fleet.log_lines_naming(&report.flagged, super::EVIDENCE_LINES);
    }
    // Nothing left: every trajectory closed its sandbox, so nothing runs or is booked.
    let status = client
        .wait_for_status(Duration::from_secs(60), "nothing left running", |s| {
            s.running.values().sum::<usize>() == 0
                && s.workers.iter().all(|w| w.cores_used == 0)
                && s.sandboxes == 0
        })
        .await
        .or_else(|_| futures::executor::block_on(client.status()))?;
    let history = {
        let mut h = client.js.get_stream(subject::HISTORY_STREAM).await?;
        let st = h.info().await?.state.clone();
        st.last_sequence as f64 / (st.messages.max(1)) as f64
    };
    // Stopped gracefully, the workers remove their sandboxes.
    let mut leaked = 0;
    for short in fleet::CPU_WORKERS {
        fleet.signal_worker(short, crate::Signal::TERM)?;
        fleet
            .wait_worker_exit(short, Duration::from_secs(60))
            .await?;
        leaked += crate::containers_of(&fleet.id(short));
    }
    let report = SoakReport {
        sandboxes: if cfg.noop_sandboxes { "noop" } else { "docker" },
        load_minutes: load_s / 60.0,
        rss_growth_last_half: growth(&samples),
        samples,
        refusals,
        actions_per_s: answered as f64 / load_s.max(1e-9),
        history_turnovers: history,
        left_running: status.running.values().sum(),
        left_cores: status.workers.iter().map(|w| w.cores_used).sum(),
        left_mem_mb: status.workers.iter().map(|w| w.mem_used_mb).sum(),
        left_sandboxes: status.sandboxes,
        leaked_containers: leaked,
        report,
    };
    if let Some(path) = &cfg.picture {
        std::fs::write(path, picture(&report)?)?;
    }
    Ok(report)
}

async fn sample(
    fleet: &Fleet,
    client: &crate::Client,
    started: Instant,
    results: usize,
) -> anyhow::Result<Sample> {
    let mut rss_mib = BTreeMap::new();
    for (name, pid) in fleet.processes() {
        if let Some(kib) = rss_kib(pid) {
            rss_mib.insert(name, kib as f64 / 1024.0);
        }
    }
    let mut stream_bytes = BTreeMap::new();
    let mut stream_messages = BTreeMap::new();
    for name in STREAMS {
        let mut s = client.js.get_stream(name).await?;
        let st = s.info().await?.state.clone();
        stream_bytes.insert(name.to_string(), st.bytes);
        stream_messages.insert(name.to_string(), st.messages);
    }
    Ok(Sample {
        t_s: started.elapsed().as_secs_f64(),
        rss_mib,
        stream_bytes,
        stream_messages,
        results,
    })
}

/// `VmRSS` of a process, KiB.
fn rss_kib(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Growth of each process's RSS from the middle of the run to its end: the mean of the
/// readings in the third quarter against the mean of those in the last eighth.
fn growth(samples: &[Sample]) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    let Some(end) = samples.last().map(|s| s.t_s) else {
        return out;
    };
    let names: std::collections::BTreeSet<&String> =
        samples.iter().flat_map(|s| s.rss_mib.keys()).collect();
    for name in names {
        let mean = |from: f64, to: f64| {
            let v: Vec<f64> = samples
                .iter()
                .filter(|s| s.t_s >= from * end && s.t_s <= to * end)
                .filter_map(|s| s.rss_mib.get(name).copied())
                .collect();
            (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
        };
        if let (Some(mid), Some(last)) = (mean(0.5, 0.625), mean(0.875, 1.0)) {
            out.insert(name.clone(), (last - mid) / mid.max(1e-9));
        }
    }
    out
}

/// Memory and streams over time.
fn picture(r: &SoakReport) -> anyhow::Result<String> {
    use tangram_shared::plot::{Body, Figure, Line, Panel};
    let names: std::collections::BTreeSet<&String> =
        r.samples.iter().flat_map(|s| s.rss_mib.keys()).collect();
    let rss: Vec<Line> = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let pts = r
                .samples
                .iter()
                .filter_map(|s| s.rss_mib.get(*n).map(|v| (s.t_s / 60.0, *v)))
                .collect();
            Line::new(n.as_str(), i, pts)
        })
        .collect();
    let streams: Vec<Line> = [
        (subject::ACTIONS_STREAM, "backlog: actions (messages)"),
        (subject::DISPATCH_STREAM, "backlog: dispatches (messages)"),
        (subject::HISTORY_STREAM, "history (messages)"),
    ]
    .iter()
    .enumerate()
    .map(|(i, (stream, label))| {
        let pts = r
            .samples
            .iter()
            .map(|s| (s.t_s / 60.0, s.stream_messages[*stream] as f64))
            .collect();
        Line::new(*label, i, pts)
    })
    .collect();
    let mut f = Figure::new("Soak: memory and streams over time", 2);
    let t = &r.report.total;
    f.subtitle = Some(format!(
        "{:.0} actions/s ({} sandboxes); {} acknowledged, {} lost, {} duplicated; {} refusals; history turned over {:.1} times",
        r.actions_per_s, r.sandboxes, t.acked, t.lost, t.duplicated, r.refusals, r.history_turnovers
    ));
    let mut p = Panel::new(
        "Resident memory per process",
        "minutes",
        "MiB",
        Body::Lines {
            log_x: false,
            lines: rss.clone(),
        },
    );
    p.keys = rss.iter().map(tangram_shared::plot::Key::of).collect();
    f.panels.push(p);
    let mut p = Panel::new(
        "Backlog and history",
        "minutes",
        "messages held",
        Body::Lines {
            log_x: false,
            lines: streams.clone(),
        },
    );
    p.keys = streams.iter().map(tangram_shared::plot::Key::of).collect();
    f.panels.push(p);
    Ok(f.svg()?)
}
