//! A dispatch's identity and the choice among stored dispatches of one action.

use tangram_core::engine::{dispatch_msg_id, latest_dispatch};
use tangram_shared::{
    Action, ActionId, ActionSpec, CpuRange, Dispatch, Encoding, Grant, JobId, SandboxExec,
    TrajectoryId, WorkerId,
};

fn dispatch(epoch: u64, attempt: u32, submitted_at_us: u64) -> Dispatch {
    Dispatch {
        epoch,
        attempt,
        action: Action {
            queue_timeout_ms: None,
            id: ActionId("a1".into()),
            job: JobId("j".into()),
            trajectory: TrajectoryId("t".into()),
            timeout_ms: 1000,
            spec: ActionSpec::SandboxExec(SandboxExec {
                argv: vec!["true".into()],
                cpus: CpuRange { min: 1, max: 1 },
                files: Default::default(),
                env: Default::default(),
                stdin: None,
            }),
        },
        grant: Grant {
            cores: 1,
            mem_mb: 0,
        },
        submitted_at_us,
        result_encoding: Encoding::Msgpack,
        instance: None,
        gpu: None,
    }
}

fn w(s: &str) -> WorkerId {
    WorkerId(s.into())
}

#[test]
fn a_retried_dispatch_to_another_worker_gets_its_own_msg_id() {
    assert_ne!(
        dispatch_msg_id(&w("w1"), &dispatch(3, 1, 0)),
        dispatch_msg_id(&w("w2"), &dispatch(3, 2, 0))
    );
}

#[test]
fn a_retry_to_the_same_worker_keeps_its_msg_id_within_an_epoch() {
    assert_eq!(
        dispatch_msg_id(&w("w1"), &dispatch(3, 1, 0)),
        dispatch_msg_id(&w("w1"), &dispatch(3, 2, 0))
    );
    assert_ne!(
        dispatch_msg_id(&w("w1"), &dispatch(3, 1, 0)),
        dispatch_msg_id(&w("w1"), &dispatch(4, 1, 0))
    );
    assert_eq!(dispatch_msg_id(&w("w1"), &dispatch(3, 1, 0)), "a1:3:w1");
}

#[test]
fn the_stored_dispatch_that_counts_is_the_latest_epoch_then_attempt() {
    assert!(latest_dispatch(Vec::new()).is_none());
    let found = vec![
        (w("w1"), dispatch(4, 1, 50)),
        (w("w2"), dispatch(3, 9, 90)),
        (w("w3"), dispatch(4, 2, 10)),
    ];
    let (worker, d) = latest_dispatch(found).expect("one counts");
    assert_eq!((worker, d.epoch, d.attempt), (w("w3"), 4, 2));
}
