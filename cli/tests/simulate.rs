//! The `tangram simulate` command, end to end.

use std::process::Command;

fn tangram(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tangram"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The text of every `<text>` element of an SVG.
fn texts(svg: &str) -> Vec<String> {
    svg.split("<text")
        .skip(1)
        .filter_map(|t| {
            let body = &t[t.find('>')? + 1..];
            Some(body[..body.find("</text>")?].trim().to_string())
        })
        .collect()
}

/// Every axis' tick labels (runs of increasing numbers) are round.
fn assert_round_ticks(svg: &str) {
    let mut axes: Vec<Vec<f64>> = vec![];
    for v in texts(svg).iter().filter_map(|t| t.parse::<f64>().ok()) {
        match axes.last_mut() {
            Some(a) if a.last().is_some_and(|l| v > *l) => a.push(v),
            _ => axes.push(vec![v]),
        }
    }
    assert!(axes.len() >= 4, "{axes:?}");
    for a in &axes {
        assert!(tangram_shared::plot::round_ticks(a), "{a:?} in {axes:?}");
    }
}

#[test]
fn simulate_json_compares_policies_on_one_workload_and_draws_them() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("act.svg");
    let (code, out, err) = tangram(&[
        "simulate",
        "--workload",
        "ai-coding",
        "--batch",
        "48",
        "--seed",
        "5",
        "--policies",
        "tangram,static,fifo-dop-4",
        "--elasticity",
        "oracle",
        "--json",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let p = v["policies"].as_array().unwrap();
    assert_eq!(
        p.iter()
            .map(|p| p["name"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["tangram", "static", "fifo-dop-4"]
    );
    for x in p {
        for key in [
            "mean_act_s",
            "p50_act_s",
            "p99_act_s",
            "mean_queue_s",
            "mean_exec_s",
            "mean_overhead_s",
            "step_time_s",
        ] {
            assert!(x[key].as_f64().is_some(), "{key} missing");
        }
        assert!(x["reserved_resource_seconds"]["cpu"].as_f64().unwrap() > 0.0);
        assert!(x["used_resource_seconds"]["cpu"].as_f64().unwrap() > 0.0);
    }
    assert_eq!(p[0]["vs_first"]["mean_act"].as_f64().unwrap(), 1.0);
    assert!(
        p[1]["vs_first"]["mean_act"].as_f64().unwrap() > 1.0,
        "static should be slower than tangram"
    );
    let picture = std::fs::read_to_string(&svg).unwrap();
    assert!(picture.starts_with("<svg") && picture.matches("<polyline").count() >= 6);
    let t = texts(&picture);
    for want in [
        "ACT distribution",
        "Pool cores held",
        "tangram",
        "static",
        "fifo-dop-4",
    ] {
        assert!(t.iter().any(|x| x == want), "{want} missing: {t:?}");
    }
    assert_round_ticks(&picture);

    // Same seed, same JSON.
    let (_, again, _) = tangram(&[
        "simulate",
        "--workload",
        "ai-coding",
        "--batch",
        "48",
        "--seed",
        "5",
        "--policies",
        "tangram,static,fifo-dop-4",
        "--elasticity",
        "oracle",
        "--json",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(out, again);

    // By default the learned-elasticity run is reported beside the oracle one.
    let (code, out, err) = tangram(&[
        "simulate",
        "--workload",
        "ai-coding",
        "--batch",
        "16",
        "--policies",
        "tangram,static",
        "--json",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let names: Vec<&str> = v["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["tangram", "tangram-learned", "static"]);
}

#[test]
fn traces_and_cluster_files_are_read_and_bad_input_is_explained() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.jsonl");
    std::fs::write(
        &trace,
        concat!(
            r#"{"job": "j1", "trajectory": "t1", "start_s": 0.0, "steps": [{"think_s": 0.5, "action": {"kind": "sandbox_exec", "elastic": {"resource": "cpu", "min": 1, "max": 8}, "t1_s": 4.0, "speedup": {"amdahl": 0.95}}}]}"#,
            "\n",
            r#"{"job": "j1", "trajectory": "t2", "start_s": 0.0, "steps": [{"think_s": 0.5, "action": {"kind": "sandbox_exec", "elastic": {"resource": "cpu", "min": 1, "max": 8}, "t1_s": 4.0, "speedup": {"power": 0.9}}}]}"#,
            "\n"
        ),
    )
    .unwrap();
    let cluster = dir.path().join("cluster.json");
    std::fs::write(
        &cluster,
        r#"{"nodes": [{"count": 1, "cpu": 8, "mem_mb": 16000, "gpu": 0}]}"#,
    )
    .unwrap();
    let svg = dir.path().join("t.svg");
    let (code, out, err) = tangram(&[
        "simulate",
        "--trace",
        trace.to_str().unwrap(),
        "--cluster",
        cluster.to_str().unwrap(),
        "--policies",
        "tangram,fifo-dop-1",
        "--json",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["cores"], 8);
    assert_eq!(v["policies"][0]["actions"], 2);

    let (code, _, err) = tangram(&[
        "simulate",
        "--workload",
        "ai-coding",
        "--policies",
        "tangram,magic",
        "--batch",
        "4",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("magic") && err.contains("fifo-dop-4"), "{err}");
    let (code, _, err) = tangram(&[
        "simulate",
        "--workload",
        "deepsearch",
        "--policies",
        "fifo-dop-4",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("no quota side"), "{err}");
}

#[test]
fn simulate_mopd_compares_evict_on_execution_with_static_and_finds_the_fewest_gpus() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("mopd.svg");
    let (code, out, err) = tangram(&[
        "simulate",
        "--workload",
        "mopd",
        "--batch",
        "400",
        "--policies",
        "tangram,static",
        "--gpus",
        "6",
        "--gpu-sweep",
        "--json",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let p = v["policies"].as_array().unwrap();
    assert_eq!(p[0]["name"], "tangram@6gpu");
    assert_eq!(p[1]["name"], "static@36gpu");
    assert!(p[0]["restores"].as_u64().unwrap() >= 6, "{}", p[0]);
    assert_eq!(p[1]["restores"], 0);
    assert!(
        p[1]["reserved_resource_seconds"]["gpu"].as_f64().unwrap()
            > p[0]["reserved_resource_seconds"]["gpu"].as_f64().unwrap()
    );
    let fewest = v["fewest_gpus_matching_static"]
        .as_u64()
        .expect("a match within 36 GPUs");
    assert!((1..=36).contains(&fewest));
    let sweep = v["gpu_sweep"].as_array().unwrap();
    let row = sweep.iter().find(|r| r["gpus"] == fewest).unwrap();
    assert_eq!(row["matches_static"], true);
    // The picture follows the GPUs: per service under each policy, with restores and
    // evictions; a GPU run has no sandbox cores to show.
    let picture = std::fs::read_to_string(&svg).unwrap();
    let t = texts(&picture);
    for want in [
        "GPUs resident per service: tangram@6gpu",
        "GPUs resident per service: static@36gpu",
        "Replica restores (solid) and evictions (dashed)",
        "teacher-0",
        "teacher-8",
        "pool: 6 GPUs",
        "pool: 36 GPUs",
    ] {
        assert!(t.iter().any(|x| x == want), "{want} missing: {t:?}");
    }
    assert!(
        !picture.to_lowercase().contains("cores held"),
        "a GPU run has no pool of cores"
    );
    assert_round_ticks(&picture);
    // A CPU-only policy has no GPU side and says so.
    let (code, _, err) = tangram(&[
        "simulate",
        "--workload",
        "mopd",
        "--policies",
        "fifo-dop-4",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("no GPU side"), "{err}");
}

#[test]
fn simulate_deepsearch_compares_pooled_quota_with_per_trajectory_slices() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("ds.svg");
    let cluster = dir.path().join("c.json");
    std::fs::write(&cluster, r#"{"nodes": [{"count": 1, "gpu": 8}], "providers": [{"name": "search", "rate": 20, "burst": 5, "concurrency": 32}]}"#).unwrap();
    let (code, out, err) = tangram(&[
        "simulate",
        "--workload",
        "deepsearch",
        "--batch",
        "200",
        "--policies",
        "tangram,static",
        "--cluster",
        cluster.to_str().unwrap(),
        "--json",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(
        v["workload"].as_str().unwrap().contains("20/s"),
        "the cluster file's provider is used"
    );
    let p = v["policies"].as_array().unwrap();
    assert_eq!(p[0]["name"], "tangram");
    let (pooled, sliced) = (
        p[0]["step_time_s"].as_f64().unwrap(),
        p[1]["step_time_s"].as_f64().unwrap(),
    );
    assert!(pooled < sliced, "pooled {pooled} vs sliced {sliced}");
    assert_eq!(p[0]["actions"], p[1]["actions"]);
    // The picture shows the calls admitted against the provider's quota.
    let picture = std::fs::read_to_string(&svg).unwrap();
    let t = texts(&picture);
    for want in [
        "search: calls admitted (job deepsearch) against the quota",
        "quota 20/s",
        "calls per second",
    ] {
        assert!(t.iter().any(|x| x == want), "{want} missing: {t:?}");
    }
    assert!(!picture.to_lowercase().contains("cores held"));
    assert_round_ticks(&picture);
}

#[test]
fn traces_mix_sandbox_reward_and_api_steps_on_one_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.jsonl");
    let cluster = dir.path().join("c.json");
    let svg = dir.path().join("t.svg");
    std::fs::write(&trace, concat!(
        r#"{"job": "j1", "trajectory": "t17", "start_s": 0.0, "steps": [{"think_s": 2.5, "action": {"kind": "sandbox_exec", "demand": {"cpu": 1, "mem_mb": 512}, "elastic": {"resource": "cpu", "min": 1, "max": 16}, "t1_s": 1.2, "speedup": {"amdahl": 0.8}}}, {"think_s": 1.0, "action": {"kind": "reward", "service": "judge", "demand": {"gpu": 1}, "t1_s": 0.6}}, {"think_s": 0.5, "action": {"kind": "api", "provider": "search", "t1_s": 0.3}}]}"#, "\n",
        r#"{"job": "j1", "trajectory": "t18", "start_s": 0.0, "steps": [{"think_s": 0.5, "action": {"kind": "api", "provider": "search", "t1_s": 0.3}}, {"think_s": 0.0, "action": {"kind": "api", "provider": "search", "t1_s": 0.3}}]}"#, "\n"
    )).unwrap();
    std::fs::write(&cluster, r#"{"nodes": [{"count": 2, "cpu": 16, "mem_mb": 64000, "gpu": 2}], "services": [{"name": "judge", "gpus": 1, "restore_s": 0.2}], "providers": [{"name": "search", "rate": 1, "burst": 2, "concurrency": 4}]}"#).unwrap();
    let (code, out, err) = tangram(&[
        "simulate",
        "--trace",
        trace.to_str().unwrap(),
        "--cluster",
        cluster.to_str().unwrap(),
        "--policies",
        "tangram",
        "--elasticity",
        "oracle",
        "--json",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let p = &v["policies"][0];
    assert_eq!(p["actions"], 5, "every step ran");
    // The judge was restored once (0.2 s of overhead over 5 actions), and t18's second search
    // waited for the provider's next token (rate 1/s, no burst to spare).
    assert!(
        (p["mean_overhead_s"].as_f64().unwrap() - 0.04).abs() < 1e-6,
        "{p}"
    );
    assert!(p["mean_queue_s"].as_f64().unwrap() > 0.1, "{p}");
    // A step naming an undeclared provider is explained.
    std::fs::write(
        &cluster,
        r#"{"nodes": [{"count": 2, "cpu": 16, "gpu": 2}], "services": [{"name": "judge"}]}"#,
    )
    .unwrap();
    let (code, _, err) = tangram(&[
        "simulate",
        "--trace",
        trace.to_str().unwrap(),
        "--cluster",
        cluster.to_str().unwrap(),
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(
        code, 1,
        "a bad cluster file is a runtime error, not a usage error"
    );
    assert!(err.contains("search") && err.contains("providers"), "{err}");
}

#[test]
fn a_bad_cli_config_file_is_refused_with_exit_64() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("tangram.toml");
    std::fs::write(&cfg, "[up]\nworkerz = 1\n").unwrap();
    let (code, _, err) = tangram(&[
        "--config",
        cfg.to_str().unwrap(),
        "up",
        "--state-dir",
        dir.path().join("s").to_str().unwrap(),
    ]);
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("workerz") && err.contains("workers"), "{err}");
    std::fs::write(&cfg, "[up]\nworkers = \"two\"\n").unwrap();
    let (code, _, err) = tangram(&["--config", cfg.to_str().unwrap(), "up"]);
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("up.workers"), "{err}");
}

#[test]
fn calibrate_writes_a_map_per_name_as_json_and_svg_and_refuses_unknown_maps() {
    let dir = tempfile::tempdir().unwrap();
    let (code, out, err) = tangram(&[
        "calibrate",
        "--maps",
        "coding-start,deepsearch-quota",
        "--small",
        "--json",
        "--svg-dir",
        dir.path().to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let maps = v["maps"].as_array().unwrap();
    assert_eq!(maps.len(), 2);
    for m in maps {
        let name = m["map"].as_str().unwrap();
        let rows = m["values"].as_array().unwrap();
        assert_eq!(rows.len(), m["ys"].as_array().unwrap().len(), "{name}");
        for r in rows {
            assert_eq!(
                r.as_array().unwrap().len(),
                m["xs"].as_array().unwrap().len()
            );
            assert!(r
                .as_array()
                .unwrap()
                .iter()
                .all(|c| c.as_f64().unwrap() > 0.0));
        }
        let svg =
            std::fs::read_to_string(dir.path().join(format!("calibration-{name}.svg"))).unwrap();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    }
    // The longer the pod start, the worse k8s does against tangram.
    let start = &maps[0]["values"][0];
    assert!(
        start[1].as_f64().unwrap() > start[0].as_f64().unwrap(),
        "{start}"
    );
    let (code, _, err) = tangram(&["calibrate", "--maps", "nope", "--small"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("coding-pods"), "{err}");
}

/// Regression: `--workload swe-images` without `--policies` failed at once ("static:
/// swe-images compares action-level placement"), since the default list names `static`. The
/// default list now runs its action-level policies; `static` named by the caller is still
/// refused (also when the caller spells out the default list).
#[test]
fn swe_images_runs_with_the_default_policies_and_refuses_static_when_named() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("images.svg");
    let svg = svg.to_str().unwrap();
    let args = ["simulate", "--workload", "swe-images", "--batch", "32"];
    let (code, out, err) = tangram(&[&args[..], &["--json", "--svg", svg]].concat());
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let names: Vec<&str> = v["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "tangram",
            "tangram/ignore-images",
            "fifo-dop-4",
            "fifo-dop-4/ignore-images",
            "first-fit",
            "first-fit/ignore-images"
        ]
    );
    // Named, even spelled as the default list is: refused.
    for named in ["tangram,static", "tangram,static,fifo-dop-4,first-fit"] {
        let (code, _, err) = tangram(&[&args[..], &["--policies", named, "--svg", svg]].concat());
        assert_eq!(code, 2, "a usage error: {err}");
        assert!(
            err.contains("static: swe-images compares action-level placement"),
            "{err}"
        );
    }
}

#[test]
fn simulate_fairness_reports_every_job_alone_and_shared_with_jains_index() {
    let (code, out, err) = tangram(&[
        "simulate",
        "--workload",
        "fairness",
        "--batch",
        "320",
        "--policies",
        "tangram",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    let scenarios = v["scenarios"].as_array().expect("scenarios");
    let names: Vec<&str> = scenarios
        .iter()
        .map(|s| s["scenario"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["two-jobs-3-1", "flood", "flood-capped", "four-jobs"]
    );
    assert!(v["load_avg_before"].is_array(), "{v}");
    for s in scenarios {
        let jain = s["fair_order_jain"].as_f64().unwrap();
        assert!(jain > 0.0 && jain <= 1.0 + 1e-9, "{s}");
        for j in s["jobs"].as_array().unwrap() {
            for k in [
                "alone_mean_act_s",
                "queue_order_mean_act_s",
                "fair_order_mean_act_s",
            ] {
                assert!(j[k].as_f64().unwrap() > 0.0, "{k}: {j}");
            }
        }
    }
    let four = &scenarios[3]["jobs"];
    assert_eq!(four.as_array().unwrap().len(), 4);
    assert_eq!(four[1]["weight"].as_f64(), Some(3.0));
}
