//! Caps per job: one job cannot take the fleet's sandboxes, memory or cores.

use super::*;
use tangram_core::engine::JobCaps;
use tangram_shared::RejectCode;

fn capped(policy: &str, caps: &[(&str, JobCaps)], workers: &[(&str, u32, u64)]) -> Harness {
    Harness::with(
        EngineConfig {
            policy: policy.into(),
            job_caps: caps.iter().map(|(j, c)| (j.to_string(), *c)).collect(),
            ..cfg()
        },
        workers,
    )
}

fn open_mb(id: &str, job: &str, traj: &str, mb: u64) -> Action {
    let mut a = open(id, job, traj);
    if let ActionSpec::SandboxOpen(o) = &mut a.spec {
        o.memory_mb = mb;
    }
    a
}

#[test]
fn a_job_at_its_sandbox_cap_waits_and_other_jobs_do_not() {
    let caps = JobCaps {
        max_sandboxes: Some(2),
        ..JobCaps::default()
    };
    let mut h = capped("tangram", &[("a", caps)], &[("w1", 8, 65536)]);
    h.open_sandbox("a", "t1");
    h.open_sandbox("a", "t2");
    let (_, fx) = h.arrive(open("a3", "a", "t3"));
    assert!(
        dispatched(&fx).is_empty(),
        "a's third open went out: {fx:?}"
    );
    let st = h.engine.status(h.at());
    assert_eq!(
        st.waiting.get("job a at its cap of 2 sandboxes"),
        Some(&1),
        "{:?}",
        st.waiting
    );
    // Another job is not held back by a's cap.
    h.open_sandbox("b", "t1");
    // a closes one: its third open goes out.
    let (_, fx) = h.arrive(close("c1", "a", "t1"));
    let (w, d) = dispatched(&fx).pop().expect("close dispatched");
    h.stored(&d);
    let fx = h.complete(&d, &w);
    let opens: Vec<_> = dispatched(&fx)
        .into_iter()
        .filter(|(_, d)| d.action.id.as_str() == "a3")
        .collect();
    assert_eq!(opens.len(), 1, "{fx:?}");
}

#[test]
fn the_cap_for_every_job_applies_to_jobs_not_listed_and_memory_is_capped_too() {
    let every = JobCaps {
        max_sandbox_mem_mb: Some(1024),
        ..JobCaps::default()
    };
    let big = JobCaps::default();
    let mut h = capped(
        "tangram",
        &[("*", every), ("big", big)],
        &[("w1", 8, 65536)],
    );
    for t in ["t1", "t2"] {
        let (_, fx) = h.arrive(open_mb(&format!("o-{t}"), "j", t, 512));
        let (w, d) = dispatched(&fx).pop().expect("open within the cap");
        h.stored(&d);
        h.complete(&d, &w);
    }
    let (_, fx) = h.arrive(open_mb("o-t3", "j", "t3", 512));
    assert!(dispatched(&fx).is_empty(), "past j's 1 GiB: {fx:?}");
    // One that could never fit the cap is told so at once.
    let (_, fx) = h.arrive(open_mb("o-huge", "j", "t4", 2048));
    let (_, code, reason) = rejected(&fx).pop().expect("rejected");
    assert_eq!(code, RejectCode::Unsatisfiable);
    assert!(reason.contains("1024 MiB in all"), "{reason}");
    // The job listed with no caps is not capped.
    for t in ["t1", "t2", "t3"] {
        let (_, fx) = h.arrive(open_mb(&format!("b-{t}"), "big", t, 512));
        assert_eq!(dispatched(&fx).len(), 1, "{fx:?}");
    }
}

/// Cores booked by the job's launched commands.
fn booked_by(h: &Harness, job: &str) -> u32 {
    h.engine.job_cores(&JobId::new(job).unwrap())
}

#[test]
fn a_jobs_commands_hold_at_most_its_cores_cap_under_every_policy() {
    for policy in ["tangram", "tangram-v2"] {
        let caps = JobCaps {
            max_cores: Some(3),
            ..JobCaps::default()
        };
        let mut h = capped(policy, &[("a", caps)], &[("w1", 8, 65536)]);
        for t in ["t1", "t2", "t3"] {
            h.open_sandbox("a", t);
        }
        h.open_sandbox("b", "t1");
        let mut running = Vec::new();
        for (i, t) in ["t1", "t2", "t3"].iter().enumerate() {
            let (_, fx) = h.arrive(exec(&format!("x{i}"), "a", t, 1, 4));
            for (w, d) in dispatched(&fx) {
                h.stored(&d);
                running.push((w, d));
            }
            assert!(
                booked_by(&h, "a") <= 3,
                "{policy}: a holds {}",
                booked_by(&h, "a")
            );
        }
        assert!(
            booked_by(&h, "a") >= 2,
            "{policy}: a was held below its cap"
        );
        // b's command takes what a cannot.
        let (_, fx) = h.arrive(exec("xb", "b", "t1", 1, 4));
        let (_, d) = dispatched(&fx).pop().expect("b's exec goes out");
        assert!(d.grant.cores >= 1, "{policy}");
        // a's commands end: what waited goes out, still within the cap.
        for (w, d) in running.drain(..) {
            let fx = h.complete(&d, &w);
            for (_, d) in dispatched(&fx) {
                h.stored(&d);
            }
            assert!(
                booked_by(&h, "a") <= 3,
                "{policy}: a holds {}",
                booked_by(&h, "a")
            );
        }
    }
}

/// Found in review: under `static` a command runs on its sandbox's own cores, but the cores
/// cap was charged again for each command, so a job whose sandboxes reached the cap could
/// run nothing. The cap bounds the sandboxes' cores there, and what can never fit is
/// rejected instead of waiting for ever.
#[test]
fn under_static_the_cores_cap_bounds_sandboxes_and_their_commands_still_run() {
    let caps = JobCaps {
        max_cores: Some(4),
        ..JobCaps::default()
    };
    let mut h = Harness::with(
        EngineConfig {
            policy: "static".into(),
            static_cores: 2,
            job_caps: [("a".to_string(), caps)].into(),
            ..cfg()
        },
        &[("w1", 16, 65536)],
    );
    h.open_sandbox("a", "t1");
    h.open_sandbox("a", "t2");
    let (_, fx) = h.arrive(open("a3", "a", "t3"));
    assert!(
        dispatched(&fx).is_empty(),
        "past 4 cores of sandboxes: {fx:?}"
    );
    for (i, t) in ["t1", "t2"].iter().enumerate() {
        let (_, fx) = h.arrive(exec(&format!("x{i}"), "a", t, 1, 2));
        assert_eq!(dispatched(&fx).len(), 1, "{t}'s command waits: {fx:?}");
    }
    // Per-command policies: a command wider than the cap at its least is rejected.
    let mut h = capped("tangram", &[("a", caps)], &[("w1", 16, 65536)]);
    h.open_sandbox("a", "t1");
    let (_, fx) = h.arrive(exec("wide", "a", "t1", 6, 8));
    let (_, code, reason) = rejected(&fx).pop().expect("rejected");
    assert_eq!(code, RejectCode::Unsatisfiable);
    assert!(reason.contains("4 cores in all"), "{reason}");
}
