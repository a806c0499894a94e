//! The pictures of `tangram simulate` and `tangram calibrate`, as figures for
//! [`tangram_shared::plot`]. A simulation's picture shows what its workload is about: ACT for
//! every workload; the pool's cores over time for sandbox workloads; GPUs resident per
//! service with restores and evictions for GPU services; calls admitted against the quota
//! for API providers. A panel appears only when its workload has that resource.

use std::collections::BTreeSet;
use tangram_core::sim::calibrate::Map;
use tangram_core::sim::{SimReport, Track};
use tangram_shared::plot::{Body, Figure, Key, Line, Panel, PlotError};

/// Points kept per line: more would only make the file bigger.
const MAX_POINTS: usize = 400;

/// Every `step`-th point and the last, so that a line keeps its ends.
fn thin(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let step = points.len().div_ceil(MAX_POINTS).max(1);
    let mut out: Vec<(f64, f64)> = points.iter().copied().step_by(step).collect();
    if let Some(&last) = points.last() {
        if out.last() != Some(&last) {
            out.push(last);
        }
    }
    out
}

/// The picture of a simulation: one entry per policy in `reports`.
pub fn simulation(title: &str, reports: &[SimReport]) -> Figure {
    let mut f = Figure::new(title, 2);
    f.legend = reports
        .iter()
        .enumerate()
        .map(|(i, r)| Key {
            label: r.policy.clone(),
            color: i,
            dashed: false,
            filled: false,
        })
        .collect();

    // ACT: the distribution per policy.
    let cdf = reports
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let acts = r.acts_ms();
            let n = acts.len() as f64;
            let pts: Vec<(f64, f64)> = acts
                .iter()
                .enumerate()
                .map(|(k, v)| (v.max(1.0) / 1e3, (k + 1) as f64 / n))
                .collect();
            Line::new(&r.policy, i, thin(&pts))
        })
        .collect();
    let mut act = Panel::new(
        "ACT distribution",
        "ACT (s, log scale)",
        "fraction of actions",
        Body::Lines {
            log_x: true,
            lines: cdf,
        },
    );
    act.y_range = Some((0.0, 1.0));
    f.panels.push(act);

    // Sandbox cores held over time.
    let cpu: Vec<Line> = reports
        .iter()
        .enumerate()
        .filter(|(_, r)| r.unit == "cpu" && !r.utilisation.is_empty())
        .map(|(i, r)| {
            let pts: Vec<(f64, f64)> = r.utilisation.iter().map(|(t, u)| (t / 1e3, *u)).collect();
            Line::new(&r.policy, i, thin(&pts))
        })
        .collect();
    if !cpu.is_empty() {
        let mut p = Panel::new(
            "Pool cores held",
            "time (s)",
            "fraction of the pool's cores",
            Body::Lines {
                log_x: false,
                lines: cpu,
            },
        );
        p.y_range = Some((0.0, 1.0));
        f.panels.push(p);
    }

    api_panels(&mut f, reports);
    gpu_panels(&mut f, reports);
    f
}

/// GPU services: restores and evictions per policy, then per policy the GPUs each service's
/// resident replicas held, stacked, under the pool's size.
fn gpu_panels(f: &mut Figure, reports: &[SimReport]) {
    let services: BTreeSet<&str> = reports
        .iter()
        .flat_map(|r| r.timeline.tracks())
        .filter_map(|t| match t {
            Track::Resident(s) => Some(s.as_str()),
            _ => None,
        })
        .collect();
    if services.is_empty() {
        return;
    }
    let mut churn = Vec::new();
    for (i, r) in reports.iter().enumerate() {
        for (track, dashed) in [(Track::Restores, false), (Track::Evictions, true)] {
            let mut pts = r.timeline.series(&track);
            if let Some(&(last, _)) = pts.last() {
                // None after the last one: down to 0 until the run's end.
                let (bin, end) = (r.timeline.bin_ms / 1e3, r.timeline.end_ms / 1e3);
                if last + bin < end {
                    pts.extend([(last + bin, 0.0), (end, 0.0)]);
                }
                let what = if dashed { "evictions" } else { "restores" };
                let mut l = Line::new(format!("{} {what}", r.policy), i, thin(&pts));
                l.dashed = dashed;
                churn.push(l);
            }
        }
    }
    let mut p = Panel::new(
        "Replica restores (solid) and evictions (dashed)",
        "time (s)",
        "per second",
        Body::Lines {
            log_x: false,
            lines: churn,
        },
    );
    p.keys = vec![
        Key {
            label: "restores".into(),
            color: 7,
            dashed: false,
            filled: false,
        },
        Key {
            label: "evictions".into(),
            color: 7,
            dashed: true,
            filled: false,
        },
    ];
    f.panels.push(p);

    let gpus = |r: &SimReport| if r.unit == "gpu" { r.pool_cores } else { 0 };
    // One scale for every policy: the largest pool, or the most GPUs ever resident.
    let resident = |r: &SimReport| -> f64 {
        let series: Vec<Vec<(f64, f64)>> = services
            .iter()
            .map(|s| r.timeline.series(&Track::Resident(s.to_string())))
            .collect();
        let bins = series.iter().map(Vec::len).max().unwrap_or(0);
        (0..bins)
            .map(|i| {
                series
                    .iter()
                    .filter_map(|s| s.get(i))
                    .map(|p| p.1)
                    .sum::<f64>()
            })
            .fold(0.0, f64::max)
    };
    let top = reports
        .iter()
        .map(|r| resident(r).max(gpus(r) as f64))
        .fold(0.0, f64::max);
    for r in reports {
        let layers: Vec<Line> = services
            .iter()
            .enumerate()
            .map(|(k, s)| {
                let pts = r.timeline.series(&Track::Resident(s.to_string()));
                Line::new(*s, k, thin(&pts))
            })
            .collect();
        let end = r.timeline.end_ms / 1e3;
        let lines = if gpus(r) > 0 {
            let mut pool = Line::new(
                format!("{} GPUs", gpus(r)),
                7,
                vec![(0.0, gpus(r) as f64), (end, gpus(r) as f64)],
            );
            pool.dashed = true;
            vec![pool]
        } else {
            Vec::new()
        };
        let mut keys: Vec<Key> = layers
            .iter()
            .map(|l| Key::fill(&l.label, l.color))
            .collect();
        keys.extend(lines.iter().map(|l| Key {
            label: format!("pool: {}", l.label),
            ..Key::of(l)
        }));
        let mut p = Panel::new(
            format!("GPUs resident per service: {}", r.policy),
            "time (s)",
            "GPUs resident",
            Body::Stacked { layers, lines },
        );
        if top > 0.0 {
            p.y_range = Some((0.0, (top * 1.1).ceil()));
        }
        p.keys = keys;
        f.panels.push(p);
    }
}

/// API providers: per provider, the calls admitted per second for each policy and job, under
/// the provider's quota.
fn api_panels(f: &mut Figure, reports: &[SimReport]) {
    let tracks: BTreeSet<(&str, &str)> = reports
        .iter()
        .flat_map(|r| r.timeline.tracks())
        .filter_map(|t| match t {
            Track::Admitted { provider, job } => Some((provider.as_str(), job.as_str())),
            _ => None,
        })
        .collect();
    let providers: BTreeSet<&str> = tracks.iter().map(|(p, _)| *p).collect();
    for provider in providers {
        let jobs: Vec<&str> = tracks
            .iter()
            .filter(|(p, _)| *p == provider)
            .map(|(_, j)| *j)
            .collect();
        let mut lines = Vec::new();
        for (i, r) in reports.iter().enumerate() {
            for (k, job) in jobs.iter().enumerate() {
                let track = Track::Admitted {
                    provider: provider.into(),
                    job: job.to_string(),
                };
                let pts = r.timeline.series(&track);
                if pts.is_empty() {
                    continue;
                }
                // One job: the policy's colour (the figure's legend names it); more: one
                // colour per policy and job, named under the panel.
                let (label, color) = if jobs.len() == 1 {
                    (r.policy.clone(), i)
                } else {
                    (format!("{} / {job}", r.policy), i * jobs.len() + k)
                };
                lines.push(Line::new(label, color, thin(&pts)));
            }
        }
        let quota = reports
            .iter()
            .find_map(|r| r.timeline.quota_per_s.get(provider).copied());
        let end = reports
            .iter()
            .map(|r| r.timeline.end_ms / 1e3)
            .fold(0.0, f64::max);
        let mut keys: Vec<Key> = if jobs.len() > 1 {
            lines.iter().map(Key::of).collect()
        } else {
            Vec::new()
        };
        if let Some(q) = quota {
            let l = Line::new(format!("quota {q}/s"), 7, vec![(0.0, q), (end, q)]).dashed();
            keys.push(Key::of(&l));
            lines.push(l);
        }
        let job_note = if jobs.len() == 1 {
            format!(" (job {})", jobs[0])
        } else {
            " per job".into()
        };
        let mut p = Panel::new(
            format!("{provider}: calls admitted{job_note} against the quota"),
            "time (s)",
            "calls per second",
            Body::Lines {
                log_x: false,
                lines,
            },
        );
        p.keys = keys;
        f.panels.push(p);
    }
}

/// A value in a cell: `-` when undefined, whole numbers without decimals.
pub fn cell(v: f64) -> String {
    if v.is_nan() {
        "-".into()
    } else if v >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// An axis value: whole numbers without decimals.
pub fn axis(v: f64) -> String {
    if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v}")
    }
}

/// A calibration map as a heat map: log-scaled colour (white at the smallest value, dark at
/// the largest), each cell labelled with its value and outlined where it is within 15% of
/// one of the paper's figures.
pub fn heatmap(m: &Map) -> Result<String, PlotError> {
    let outlined = m
        .values
        .iter()
        .enumerate()
        .flat_map(|(j, row)| {
            row.iter().enumerate().filter_map(move |(i, v)| {
                (v.is_finite() && m.targets.iter().any(|t| t.near(m.xs[i], *v, 0.15)))
                    .then_some((i, j))
            })
        })
        .collect();
    let mut f = Figure::new(m.title.clone(), 1);
    f.subtitle = Some(format!("cell: {}; fixed: {}", m.value, m.fixed));
    f.panel_size = (
        (170 + 92 * m.xs.len() as u32).max(760),
        (120 + 44 * m.ys.len() as u32).max(300),
    );
    let targets: Vec<&str> = m.targets.iter().map(|t| t.label).collect();
    f.legend = vec![Key {
        label: format!("outlined: within 15% of the paper's {}", targets.join(", ")),
        color: 1,
        dashed: false,
        filled: false,
    }];
    f.panels.push(Panel::new(
        "",
        m.x_label,
        m.y_label,
        Body::Heat {
            xs: m.xs.iter().map(|x| axis(*x)).collect(),
            ys: m.ys.iter().map(|y| axis(*y)).collect(),
            values: m.values.clone(),
            labels: m
                .values
                .iter()
                .map(|r| r.iter().map(|v| cell(*v)).collect())
                .collect(),
            outlined,
        },
    ));
    f.svg()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tangram_core::sim_api::{simulate_api, DeepSearch, QuotaMode};
    use tangram_core::sim_gpu::{simulate_gpu, GpuMode, Mopd};

    fn panel<'a>(f: &'a Figure, title: &str) -> &'a Panel {
        f.panels
            .iter()
            .find(|p| p.title == title)
            .unwrap_or_else(|| panic!("no panel {title:?} in {:?}", titles(f)))
    }

    fn titles(f: &Figure) -> Vec<&str> {
        f.panels.iter().map(|p| p.title.as_str()).collect()
    }

    #[test]
    fn a_gpu_run_shows_each_services_gpus_and_no_pool_of_cores() {
        let w = Mopd {
            batch: 200,
            seed: 2,
        }
        .generate();
        let reports = [
            simulate_gpu(&w, GpuMode::Pooled { gpus: 4 }, "tangram").0,
            simulate_gpu(
                &w,
                GpuMode::Static {
                    gpus_per_service: 1,
                },
                "static",
            )
            .0,
        ];
        let f = simulation("t", &reports);
        assert_eq!(
            titles(&f),
            [
                "ACT distribution",
                "Replica restores (solid) and evictions (dashed)",
                "GPUs resident per service: tangram",
                "GPUs resident per service: static",
            ]
        );
        let Body::Stacked { layers, lines } = &panel(&f, "GPUs resident per service: tangram").body
        else {
            panic!("a stacked panel");
        };
        assert_eq!(layers.len(), Mopd::TEACHERS);
        assert!(layers.iter().all(|l| l.points.iter().any(|p| p.1 > 0.0)));
        assert_eq!(lines[0].points[0].1, 4.0, "the pool's size");
        let Body::Lines { lines, .. } =
            &panel(&f, "Replica restores (solid) and evictions (dashed)").body
        else {
            panic!("lines");
        };
        assert!(lines
            .iter()
            .any(|l| !l.dashed && l.points.iter().any(|p| p.1 > 0.0)));
    }

    #[test]
    fn an_api_run_shows_the_calls_admitted_against_the_quota() {
        let mut w = DeepSearch {
            batch: 200,
            seed: 2,
        }
        .generate();
        w.provider.rate_per_s = 20.0;
        let reports = [
            simulate_api(&w, QuotaMode::Pooled, "tangram"),
            simulate_api(&w, QuotaMode::PerTrajectory, "static"),
        ];
        let f = simulation("t", &reports);
        assert!(
            !titles(&f).iter().any(|t| t.contains("cores")),
            "{:?}",
            titles(&f)
        );
        let p = panel(
            &f,
            "search: calls admitted (job deepsearch) against the quota",
        );
        let Body::Lines { lines, .. } = &p.body else {
            panic!("lines");
        };
        let quota = lines.iter().find(|l| l.label == "quota 20/s").unwrap();
        assert!(quota.points.iter().all(|q| q.1 == 20.0));
        let bin_s = reports[0].timeline.bin_ms / 1e3;
        for policy in ["tangram", "static"] {
            let l = lines.iter().find(|l| l.label == policy).unwrap();
            let peak = l.points.iter().map(|q| q.1).fold(0.0, f64::max);
            assert!(peak > 10.0, "{policy}: {peak}/s at most, against 20/s");
            // The token bucket's bound: by any time, no more than the burst plus the rate.
            let mut admitted = 0.0;
            for (k, q) in l.points.iter().enumerate() {
                admitted += q.1 * bin_s;
                let by = (k + 1) as f64 * bin_s;
                assert!(
                    admitted <= w.provider.burst as f64 + 20.0 * by + 1e-6,
                    "{policy} by {by} s"
                );
            }
        }
    }
}
