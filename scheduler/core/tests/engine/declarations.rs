//! Fleet-wide definitions come from the operator, or from the workers that established them,
//! never from whichever worker spoke last: a worker whose declaration of a provider's quota
//! differs is refused, counted, and given none of the provider's calls.

use super::*;
use tangram_core::engine::Observation;
use tangram_core::quota::ProviderQuota;

fn search(rate: f64) -> tangram_shared::ProviderReport {
    tangram_shared::ProviderReport {
        name: "search".into(),
        rate_per_s: rate,
        burst: 2,
        concurrency: 4,
        allow: vec!["GET /*".into()],
        allow_headers: vec![],
        slow_ms: None,
    }
}

fn declare(h: &mut Harness, w: &str, rate: f64) -> Vec<Effect> {
    let mut hb = h.heartbeat_of(w, 4, 8192, &[], &[]);
    hb.providers = vec![search(rate)];
    h.step(Event::Heartbeat(Box::new(hb)))
}

fn refusals(fx: &[Effect]) -> Vec<(String, String)> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::Observe(Observation::DeclarationRefused { name, worker, .. }) => {
                Some((name.clone(), worker.to_string()))
            }
            _ => None,
        })
        .collect()
}

fn call(id: &str) -> Action {
    Action {
        queue_timeout_ms: None,
        id: ActionId::new(id).unwrap(),
        job: JobId::new("j").unwrap(),
        trajectory: TrajectoryId::new("t").unwrap(),
        timeout_ms: 10_000,
        spec: ActionSpec::Api(tangram_shared::Api {
            provider: "search".into(),
            method: "GET".into(),
            path: "/q".into(),
            query: Default::default(),
            body: None,
            headers: Default::default(),
        }),
    }
}

/// Regression (issue 30, seen live): a forging worker redeclared the provider at 1e6/s and
/// took 404 of 500 calls, which it answered `unknown_provider`.
#[test]
fn a_worker_cannot_redefine_a_providers_quota_the_workers_serving_it_declared() {
    let mut h = Harness::new(&[]);
    assert!(refusals(&declare(&mut h, "api-a", 20.0)).is_empty());
    let fx = declare(&mut h, "forger", 1e6);
    assert_eq!(refusals(&fx), vec![("search".into(), "forger".into())]);
    // Counted once, not on every heartbeat.
    assert!(refusals(&declare(&mut h, "forger", 1e6)).is_empty());
    let st = h.engine.status(h.at());
    assert_eq!(st.providers[0].rate_per_s, 20.0);
    // Every call goes to the worker that serves the quota in force.
    for i in 0..10 {
        let (_, fx) = h.arrive(call(&format!("c{i}")));
        for (w, d) in dispatched(&fx) {
            assert_eq!(w, "api-a", "a call went to the forger");
            h.stored(&d);
            h.complete(&d, &w);
        }
    }
    // Declaring the quota in force again, it serves the provider too.
    assert!(refusals(&declare(&mut h, "forger", 20.0)).is_empty());
}

#[test]
fn the_operators_definition_is_the_quota_and_workers_must_match_it() {
    let mut h = Harness::with(
        EngineConfig {
            providers: [(
                "search".to_string(),
                ProviderQuota {
                    name: "search".into(),
                    rate_per_s: 5.0,
                    burst: 2,
                    concurrency: 4,
                    slow_ms: None,
                },
            )]
            .into(),
            ..cfg()
        },
        &[],
    );
    // The first worker to speak does not set it either.
    assert_eq!(
        refusals(&declare(&mut h, "api-a", 20.0)),
        vec![("search".into(), "api-a".into())]
    );
    assert!(h.engine.status(h.at()).providers.is_empty());
    assert!(refusals(&declare(&mut h, "api-b", 5.0)).is_empty());
    let st = h.engine.status(h.at());
    assert_eq!(st.providers.len(), 1);
    assert_eq!(st.providers[0].rate_per_s, 5.0);
}

fn gpu_declares(h: &mut Harness, w: &str, gpus: usize, size: u8, slots: u32) -> Vec<Effect> {
    let hb = judge_heartbeat(h, w, gpus, size, slots);
    h.step(Event::Heartbeat(Box::new(hb)))
}

fn judge_status(h: &Harness) -> tangram_shared::status::ServiceStatus {
    let st = h.engine.status(h.at());
    st.services
        .into_iter()
        .find(|s| s.name == "judge")
        .expect("judge")
}

/// Regression (issue 30): any worker's heartbeat redeclared a service's size and slots for
/// the whole fleet.
#[test]
fn a_worker_cannot_resize_a_service_or_change_its_slots() {
    let mut h = Harness::new(&[]);
    assert!(refusals(&gpu_declares(&mut h, "g1", 1, 1, 1)).is_empty());
    // Another worker's credential declares the service 8 GPUs wide with 100 slots: refused,
    // counted once.
    let fx = gpu_declares(&mut h, "g2", 0, 8, 100);
    assert_eq!(refusals(&fx), vec![("judge".into(), "g2".into())]);
    assert!(
        refusals(&gpu_declares(&mut h, "g2", 0, 8, 100)).is_empty(),
        "counted once"
    );
    let judge = judge_status(&h);
    assert_eq!(judge.gpus, 1, "the fleet's size stands");
    // One slot per replica still: g1's one GPU takes one call at a time.
    let (_, fx) = h.arrive(score("s1", "j"));
    assert_eq!(dispatched(&fx).len(), 1);
    let (_, fx) = h.arrive(score("s2", "j"));
    assert!(
        dispatched(&fx).is_empty(),
        "a second call shared g1's one slot: {fx:?}"
    );
}

#[test]
fn the_operators_service_definition_stands_and_workers_must_match_it() {
    let defined = tangram_core::gpu::ServiceSpec {
        name: "judge".into(),
        gpus: 1,
        restore_ms: 700,
        slots: 2,
    };
    let mut h = Harness::with(
        EngineConfig {
            services: [("judge".to_string(), defined)].into(),
            ..cfg()
        },
        &[],
    );
    // A worker that declares one slot is refused; one that declares two serves it.
    let fx = gpu_declares(&mut h, "g1", 1, 1, 1);
    assert_eq!(refusals(&fx), vec![("judge".into(), "g1".into())]);
    assert!(refusals(&gpu_declares(&mut h, "g2", 1, 1, 2)).is_empty());
    let judge = judge_status(&h);
    assert_eq!(judge.restore_ms, 700, "the operator's first estimate");
    // Two calls share one replica (the fleet's two slots), wherever it is: a worker refused
    // for a service still lends its GPUs to it, at the fleet's size and slots.
    let mut on = Vec::new();
    for id in ["s1", "s2"] {
        let (_, fx) = h.arrive(score(id, "j"));
        let out = dispatched(&fx);
        assert_eq!(out.len(), 1, "{fx:?}");
        let route = out[0].1.gpu.clone().expect("a route");
        on.push((out[0].0.clone(), route.chunk));
    }
    assert_eq!(on[0], on[1], "one replica, two slots: {on:?}");
}

/// Found in review: a service the operator defined, that every worker declared otherwise,
/// was unknown to the fleet (its calls rejected `unknown_service`).
#[test]
fn a_defined_service_stands_even_when_no_worker_declares_it_as_defined() {
    let defined = tangram_core::gpu::ServiceSpec {
        name: "judge".into(),
        gpus: 1,
        restore_ms: 700,
        slots: 32,
    };
    let mut h = Harness::with(
        EngineConfig {
            services: [("judge".to_string(), defined)].into(),
            ..cfg()
        },
        &[],
    );
    let fx = gpu_declares(&mut h, "g1", 1, 1, 8);
    assert_eq!(refusals(&fx), vec![("judge".into(), "g1".into())]);
    let (_, fx) = h.arrive(score("s1", "j"));
    assert_eq!(dispatched(&fx).len(), 1, "{fx:?}");
}
