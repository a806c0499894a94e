//! Actions that call out: `api` through the providers, `reward` through the model replicas.

use super::{infra, reason, Worker};
use crate::metrics as m;
use crate::providers::CallError;
use crate::services::ServiceError;
use std::time::Duration;
use tangram_shared::{ActionResult, Dispatch, InfraCode, Outcome, RejectCode, Timing};

impl Worker {
    pub(super) async fn api(
        &self,
        d: &Dispatch,
        api: &tangram_shared::Api,
        queued_us: u64,
        result: &mut ActionResult,
    ) {
        let Some(providers) = &self.providers else {
            result.outcome = Outcome::Rejected {
                code: RejectCode::UnknownProvider,
                reason: format!("worker {} calls no external providers", self.config.id),
            };
            return;
        };
        let timeout = Duration::from_millis(d.action.timeout_ms);
        let called = tokio::select! {
            r = providers.call(api, timeout) => r,
            _ = self.hard_stop.cancelled() => {
                result.outcome = infra(InfraCode::Shutdown, format!("worker {} stopped", self.config.id));
                return;
            }
        };
        match called {
            Ok(c) => {
                result.timing = Timing::new(queued_us, c.wait_us, c.call_us);
                m::api_call(&api.provider, c.reply.status, c.call_us as f64 / 1e6);
                result.http = Some(c.reply);
            }
            Err(CallError::Timeout(ms)) => {
                result.timing = Timing::new(queued_us, 0, ms * 1000);
                result.outcome = Outcome::TimedOut;
            }
            Err(CallError::Unknown(p)) => {
                result.outcome = Outcome::Rejected {
                    code: RejectCode::UnknownProvider,
                    reason: format!("worker {} has no provider named {p:?}", self.config.id),
                };
            }
            Err(CallError::NotAllowed(why)) => {
                result.outcome = Outcome::Rejected {
                    code: RejectCode::NotAllowed,
                    reason: why,
                };
            }
            Err(e @ (CallError::Unreachable { .. } | CallError::Credential { .. })) => {
                result.outcome = infra(InfraCode::Provider, reason(&e))
            }
        }
    }

    pub(super) async fn reward(
        &self,
        d: &Dispatch,
        reward: &tangram_shared::Reward,
        queued_us: u64,
        result: &mut ActionResult,
    ) {
        let Some(services) = &self.services else {
            result.outcome = Outcome::Rejected {
                code: RejectCode::UnknownService,
                reason: format!("worker {} serves no model services", self.config.id),
            };
            return;
        };
        let Some(route) = &d.gpu else {
            result.outcome = infra(
                InfraCode::Service,
                "a reward dispatch came without a GPU route".to_string(),
            );
            return;
        };
        let timeout = Duration::from_millis(d.action.timeout_ms);
        let served = tokio::select! {
            r = services.serve(route, &reward.inputs, &reward.options, timeout) => r,
            _ = tokio::time::sleep(timeout + Duration::from_secs(1)) => {
                result.outcome = Outcome::TimedOut;
                return;
            }
            _ = self.hard_stop.cancelled() => {
                result.outcome = infra(InfraCode::Shutdown, format!("worker {} stopped", self.config.id));
                return;
            }
        };
        match served {
            Ok(s) => {
                result.timing = Timing::new(queued_us, s.overhead_us, s.exec_us);
                result.scores = Some(s.scores);
                result.service = Some(tangram_shared::ServiceUse {
                    service: route.service.clone(),
                    gpus: s.gpus,
                    restored: s.restored,
                    evicted: s.evicted,
                });
            }
            Err(ServiceError::Unknown(name)) => {
                result.outcome = Outcome::Rejected {
                    code: RejectCode::UnknownService,
                    reason: format!("worker {} serves no service named {name:?}", self.config.id),
                };
            }
            Err(e) => result.outcome = infra(InfraCode::Service, reason(&e)),
        }
    }
}
