//! Image-aware placement: a sandbox open naming an image goes where the image is, unless the
//! load there outweighs the pull.

use super::*;
use tangram_shared::ImageReport;

fn open_image(id: &str, traj: &str, image: &str) -> Action {
    let mut a = open(id, "j", traj);
    if let ActionSpec::SandboxOpen(o) = &mut a.spec {
        o.image = Some(image.into());
    }
    a
}

/// `w` reports that it holds `image` (`mb` in size).
fn holds(h: &mut Harness, w: &str, image: &str, mb: u64) {
    let mut hb = h.heartbeat_of(w, 64, 1 << 20, &[], &[]);
    hb.images = vec![ImageReport {
        reference: image.into(),
        id: "sha256:aa".into(),
        size_bytes: mb * 1_000_000,
    }];
    h.step(Event::Heartbeat(Box::new(hb)));
}

fn worker_of(fx: &[Effect]) -> String {
    dispatched(fx).into_iter().next().expect("dispatched").0
}

#[test]
fn an_open_goes_to_the_worker_holding_its_image_in_any_spelling() {
    let mut h = Harness::new(&[("a", 64, 1 << 20), ("b", 64, 1 << 20)]);
    // a holds the image and gets a sandbox: b is emptier (chosen when ignoring images).
    holds(&mut h, "a", "docker.io/library/swe:v1", 2_000);
    assert_eq!(h.open_sandbox("j", "busy"), "a");
    let (_, fx) = h.arrive(open_image("o1", "t1", "swe:v1"));
    assert_eq!(worker_of(&fx), "a");
    // Without an image, the emptier worker.
    let (_, fx) = h.arrive(open("o2", "j", "t2"));
    assert_eq!(worker_of(&fx), "b");
}

#[test]
fn placement_that_ignores_images_spreads_as_before() {
    let config = EngineConfig {
        image_locality: false,
        ..cfg()
    };
    let mut h = Harness::with(config, &[("a", 64, 1 << 20), ("b", 64, 1 << 20)]);
    holds(&mut h, "b", "swe:v1", 2_000);
    let (_, fx) = h.arrive(open_image("o0", "t0", "swe:v1"));
    let first = worker_of(&fx);
    let (_, fx) = h.arrive(open_image("o1", "t1", "swe:v1"));
    assert_ne!(worker_of(&fx), first, "spread, image or not");
}

#[test]
fn opens_of_a_new_image_follow_the_first_to_share_its_pull() {
    let mut h = Harness::new(&[("a", 64, 1 << 20), ("b", 64, 1 << 20), ("c", 64, 1 << 20)]);
    // Several opens of an image nobody holds, in one cycle and in later ones.
    let (_, fx) = h.arrive(open_image("o0", "t0", "swe:new"));
    let first = worker_of(&fx);
    for i in 1..5 {
        let (_, fx) = h.arrive(open_image(&format!("o{i}"), &format!("t{i}"), "swe:new"));
        assert_eq!(worker_of(&fx), first, "open {i} shares the pull in flight");
    }
    // Another image starts on another worker (the first is now the busiest).
    let (_, fx) = h.arrive(open_image("p0", "u0", "swe:other"));
    assert_ne!(worker_of(&fx), first);
}

#[test]
fn an_open_image_stays_known_after_its_sandbox_closed() {
    let mut h = Harness::new(&[("a", 64, 1 << 20), ("b", 64, 1 << 20)]);
    let (_, fx) = h.arrive(open_image("o0", "t0", "swe:v2"));
    let (w, d) = dispatched(&fx).into_iter().next().unwrap();
    h.stored(&d);
    h.complete(&d, &w);
    let (_, fx) = h.arrive(close("c0", "j", "t0"));
    let (_, d) = dispatched(&fx).into_iter().next().unwrap();
    h.stored(&d);
    h.complete(&d, &w);
    // The other worker is now emptier, but this one pulled the image.
    h.open_sandbox("j", "elsewhere");
    let (_, fx) = h.arrive(open_image("o1", "t1", "swe:v2"));
    assert_eq!(worker_of(&fx), w);
}

#[test]
fn a_loaded_holder_loses_to_an_idle_worker_when_the_load_outweighs_the_pull() {
    // 4 cores each; one more sandbox per core is worth 60 s, a 100 MB image pulls in 1 s.
    let mut h = Harness::new(&[("a", 4, 1 << 20), ("b", 4, 1 << 20)]);
    let mut hb = h.heartbeat_of("b", 4, 1 << 20, &[], &[]);
    hb.images = vec![ImageReport {
        reference: "swe:small".into(),
        id: "sha256:bb".into(),
        size_bytes: 100_000_000,
    }];
    h.step(Event::Heartbeat(Box::new(hb)));
    // b takes the first open of the image...
    let (_, fx) = h.arrive(open_image("o0", "t0", "swe:small"));
    assert_eq!(worker_of(&fx), "b");
    // ...but with b holding one sandbox (15 s of load per sandbox on 4 cores) and a pull
    // of 1 s on a, the next goes to a.
    let (_, fx) = h.arrive(open_image("o1", "t1", "swe:small"));
    assert_eq!(worker_of(&fx), "a");
}
