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
