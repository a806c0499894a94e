//! Failover: a new leader built from what is durable, as a term starts (cordons, the backlog
//! scan, heartbeats, redelivered messages), the shell's answers to its fetches, and what a
//! worker does with dispatches addressed to an earlier instance.

use super::*;

impl World {
    /// A new leader: a fresh engine told what the streams and the cordon store keep, in the
    /// order the shell starts a term (cordons, then the backlog scan, worker heartbeats and
    /// redelivered action messages as they come).
    pub(super) fn failover(&mut self, published: bool, backlog_first: bool, late_regrants: bool) {
        // What the old leader handed to the shell and never heard back about.
        for (w, d) in std::mem::take(&mut self.handed) {
            if !published {
                continue;
            }
            let wi = WORKERS.iter().position(|x| x.0 == w).unwrap();
            self.store(&w, &d);
            if self.alive[wi] {
                // The old leader is going: only what the worker stores matters.
                let _ = self.take_in(&w, d);
            }
        }
        // A drain whose deadline passed closed the worker's sandboxes.
        for (&w, at) in &self.cordons {
            if at.is_some_and(|t| self.h.now >= t) {
                self.sandboxes.remove(WORKERS[w].0);
            }
        }
        // The old leader's re-sizes no worker has taken, published late (see the step);
        // earlier terms' stay where they are in the stream.
        if late_regrants {
            let ending = cfg().epoch + self.terms as u64 - 1;
            let (late, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.regrants)
                .into_iter()
                .partition(|(_, r, _)| r.epoch == ending);
            self.regrants = kept;
            self.late.extend(late.into_iter().map(|(w, r, _)| (w, r)));
        }
        // Each term under an epoch of its own, as the epoch store hands them out.
        let config = EngineConfig {
            policy: self.policy.clone(),
            await_backlog: true,
            epoch: cfg().epoch + self.terms as u64,
            ..cfg()
        };
        self.h.engine = Engine::new(config).expect("a known policy");
        // The old leader's fetches die with it.
        self.fetches.clear();
        self.terms += 1;
        let cordons: Vec<(usize, Option<u64>)> =
            self.cordons.iter().map(|(w, at)| (*w, *at)).collect();
        for (w, at) in cordons {
            let fx = self.h.step(Event::Cordon {
                worker: WorkerId::new(WORKERS[w].0).unwrap(),
                cordon: Some(tangram_shared::status::CordonRecord {
                    drain_by_unix_ms: at,
                    by: "props".into(),
                    at_unix_ms: self.h.now,
                }),
            });
            self.absorb(fx);
        }
        if backlog_first {
            self.scan_backlog();
        }
        for w in 0..3 {
            if self.alive[w] {
                let fx = self.beat_joining(w);
                self.absorb(fx);
            }
        }
        self.redeliver();
        if !backlog_first {
            self.scan_backlog();
        }
    }

    /// The term's backlog scan: every stored dispatch without a stored result.
    pub(super) fn scan_backlog(&mut self) {
        let backlog: Vec<(String, Dispatch)> = self
            .stored
            .iter()
            .filter(|((_, id), _)| !self.results.contains(id))
            .map(|((w, _), d)| (w.clone(), d.clone()))
            .collect();
        for (w, d) in backlog {
            let seq = self.stored_seq[&(w.clone(), d.action.id.clone())];
            // The re-size the worker ends on: the newest by epoch and the leader's sequence
            // among those it has not taken, as the scan reads them.
            let resize = self
                .regrants
                .iter()
                .filter(|(x, r, _)| x == &w && r.id == d.action.id && r.attempt == d.attempt)
                .max_by_key(|(_, r, _)| (r.epoch, r.seq))
                .map(|(_, r, seq)| tangram_core::PendingResize {
                    cores: r.grant.cores,
                    seq: *seq,
                    epoch: r.epoch,
                });
            let fx = self.h.step(Event::AdoptStored {
                worker: WorkerId::new(&w).unwrap(),
                dispatch: Box::new(d),
                seq,
                resize,
            });
            self.absorb(fx);
        }
        let fx = self.h.step(Event::BacklogRead);
        self.absorb(fx);
    }

    /// Every action message not acked comes back, with what the intake looks up for it: a
    /// stored result, and the dispatch that counts among the stored ones.
    pub(super) fn redeliver(&mut self) {
        let unacked: Vec<(Delivery, Action)> = self
            .messages
            .iter()
            .filter(|(d, _)| !self.acked.contains(d))
            .map(|(d, a)| (*d, a.clone()))
            .collect();
        for (delivery, action) in unacked {
            let seen = self.results.contains(&action.id);
            let found = self
                .stored
                .iter()
                .filter(|((_, id), _)| id == &action.id)
                .map(|((w, _), d)| (WorkerId::new(w).unwrap(), d.clone()));
            let dispatched = tangram_core::engine::latest_dispatch(found).map(Box::new);
            let fx = self.h.step(Event::Arrived(Box::new(Arrival {
                action,
                encoding: Encoding::Msgpack,
                submitted_at_us: self.h.now * 1000,
                delivery,
                seen,
                model: None,
                dispatched,
                bytes: 0,
                redelivered: false,
            })));
            self.absorb(fx);
        }
    }

    /// Worker `w`'s first heartbeat to a new leader: what it runs and the sandboxes it holds.
    pub(super) fn beat_joining(&mut self, w: usize) -> Vec<Effect> {
        let name = WORKERS[w].0;
        let running = self.running_ids(name);
        let running: Vec<&str> = running.iter().map(String::as_str).collect();
        let held: Vec<String> = self
            .sandboxes
            .get(name)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        let held: Vec<(&str, &str)> = held.iter().map(|t| ("j", t.as_str())).collect();
        self.beat_with(w, &running, &held)
    }

    /// The shell answers a fetch: the dispatch as stored for that worker, or none.
    pub(super) fn answer_fetch(&mut self, k: usize) {
        if self.fetches.is_empty() {
            return;
        }
        let (worker, id) = self.fetches.remove(k % self.fetches.len());
        let event = match self.stored.get(&(worker.to_string(), id.clone())) {
            Some(d) => Event::Adopt {
                worker,
                dispatch: Box::new(d.clone()),
            },
            None => Event::AdoptFailed { id },
        };
        let fx = self.h.step(event);
        self.absorb(fx);
    }

    /// Live worker `w` takes in a stored dispatch, as its admission decides: one addressed to
    /// its instance (or to none) runs; one addressed to an earlier instance is answered at
    /// once with a `worker_lost` result, then acked.
    pub(super) fn take_in(&mut self, w: &str, d: Dispatch) -> Vec<Effect> {
        self.take_regrants_of(w);
        if let Some(seq) = self.stored_seq.get(&(w.to_string(), d.action.id.clone())) {
            self.took(w, *seq);
        }
        let addressed = d.instance.is_none() || d.instance.as_ref() == self.h.instance.get(w);
        if addressed {
            // Run: the worker knows the dispatch's epoch from now on.
            let newest = self.epochs.entry(w.to_string()).or_insert(d.epoch);
            *newest = (*newest).max(d.epoch);
            let newest = *newest;
            // An old leader's late re-sizes for this worker land behind the first dispatch
            // that taught it a later epoch.
            let (behind, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.late)
                .into_iter()
                .partition(|(x, r)| x == w && r.epoch < newest);
            self.late = rest;
            for (x, r) in behind {
                let seq = self.next_seq();
                self.regrants.push((x, r, seq));
            }
            self.running.push((w.to_string(), d));
            return Vec::new();
        }
        let first = !self.results.contains(&d.action.id);
        self.result_stored(&d.action.id, first);
        let lost = Outcome::InfraError {
            code: tangram_shared::InfraCode::WorkerLost,
            reason: format!("worker {w} restarted while this action was in flight"),
        };
        let r = ActionResult::new(d.action.id.clone(), d.action.job.clone(), lost, self.h.now)
            .for_action(&d.action, d.attempt);
        self.h.step(Event::Result(Box::new(r)))
    }

    /// Live worker `w` reads every dispatch waiting for it in the backlog.
    pub(super) fn take_backlog(&mut self, w: usize) -> Vec<Effect> {
        let name = WORKERS[w].0;
        let waiting: Vec<Dispatch> = self
            .stored
            .iter()
            .filter(|((x, id), _)| x == name && !self.results.contains(id))
            .filter(|(_, d)| !self.runs_on(name).any(|r| r.action.id == d.action.id))
            .map(|(_, d)| d.clone())
            .collect();
        let mut fx = Vec::new();
        for d in waiting {
            fx.extend(self.take_in(name, d));
        }
        fx
    }
}
