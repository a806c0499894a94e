//! Pulling a sandbox image the worker lacks, from a registry its `sandbox.pull` allow-list
//! names, with the worker's own credentials for that registry. Concurrent opens of one image
//! share one pull; a pull has a deadline; a failure says whether the image is unknown to the
//! registry (the submitter's mistake) or the registry could not serve it (infrastructure).

use crate::config::PullConfig;
use bollard::auth::DockerCredentials;
use bollard::query_parameters::CreateImageOptionsBuilder;
use bollard::Docker;
use futures::future::{BoxFuture, FutureExt as _, Shared};
use futures::StreamExt as _;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tangram_shared::image::ImageRef;

/// Why a pull did not give the worker the image.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PullError {
    /// The allow-list refuses it, or the registry does not have it.
    #[error("{0}")]
    Refused(String),
    /// The registry could not be reached or refused the worker (credentials), or the pull
    /// took too long.
    #[error("{0}")]
    Failed(String),
}

type Pending = Shared<BoxFuture<'static, Result<u64, PullError>>>;

/// Pulls in progress, by image: a second open of an image being pulled waits for the same
/// pull.
#[derive(Debug, Default, Clone)]
pub struct Pulls {
    running: Arc<Mutex<HashMap<String, Pending>>>,
}

impl Pulls {
    /// Pulls `image` unless a pull of it is already running, and waits for that pull;
    /// returns how long the pull took, µs.
    pub async fn pull(
        &self,
        docker: &Docker,
        config: &PullConfig,
        image: &str,
    ) -> Result<u64, PullError> {
        if let Some(why) = config.refusal(image) {
            let refused = Err(PullError::Refused(format!(
                "image {image:?} cannot be pulled: {why}"
            )));
            crate::metrics::image_pull("refused", None);
            return refused;
        }
        let (docker, config, owned) = (docker.clone(), config.clone(), image.to_string());
        self.shared(image, move || {
            async move {
                // Counted once per pull, however many opens wait for it.
                let r = pull_once(&docker, &config, &owned).await;
                let (outcome, took_us) = match &r {
                    Ok(us) => ("ok", Some(*us)),
                    Err(PullError::Refused(_)) => ("refused", None),
                    Err(PullError::Failed(_)) => ("failed", None),
                };
                crate::metrics::image_pull(outcome, took_us);
                r
            }
            .boxed()
        })
        .await
    }

    /// Runs `start()` for `image` unless a run for it is in progress, and waits for
    /// whichever run is: one pull serves every open that asks while it runs.
    async fn shared(
        &self,
        image: &str,
        start: impl FnOnce() -> BoxFuture<'static, Result<u64, PullError>>,
    ) -> Result<u64, PullError> {
        let pending = {
            let mut running = self.running.lock().expect("pulls lock");
            running
                .entry(image.to_string())
                .or_insert_with(|| {
                    let (pulls, image, run) = (self.running.clone(), image.to_string(), start());
                    async move {
                        let r = run.await;
                        pulls.lock().expect("pulls lock").remove(&image);
                        r
                    }
                    .boxed()
                    .shared()
                })
                .clone()
        };
        pending.await
    }

    /// Pulls running now.
    pub fn running(&self) -> usize {
        self.running.lock().expect("pulls lock").len()
    }
}

async fn pull_once(docker: &Docker, config: &PullConfig, image: &str) -> Result<u64, PullError> {
    let r = ImageRef::parse(image).map_err(PullError::Refused)?;
    let credentials = config.auth.get(&r.registry).map(|a| DockerCredentials {
        username: Some(a.username.clone()),
        password: Some(a.password.clone()),
        serveraddress: Some(r.registry.clone()),
        ..Default::default()
    });
    let options = CreateImageOptionsBuilder::default()
        .from_image(image)
        .build();
    let began = tokio::time::Instant::now();
    let stream = async {
        let mut s = docker.create_image(Some(options), None, credentials);
        while let Some(item) = s.next().await {
            let info = item.map_err(|e| classify(image, &e.to_string()))?;
            if let Some(e) = info.error_detail.and_then(|d| d.message) {
                return Err(classify(image, &e));
            }
        }
        Ok(())
    };
    match tokio::time::timeout(config.timeout, stream).await {
        Ok(Ok(())) => Ok(began.elapsed().as_micros() as u64),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(PullError::Failed(format!(
            "pulling image {image:?} took longer than {} s (sandbox.pull_timeout_ms)",
            config.timeout.as_secs()
        ))),
    }
}

/// A registry's "no such image" is the submitter's mistake; anything else (unreachable,
/// unauthorised, a server error) is the infrastructure's.
fn classify(image: &str, message: &str) -> PullError {
    let m = message.to_ascii_lowercase();
    if m.contains("manifest unknown") || m.contains("not found") || m.contains("name unknown") {
        PullError::Refused(format!("image {image:?} is not in its registry: {message}"))
    } else {
        PullError::Failed(format!("pulling image {image:?}: {message}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test(start_paused = true)]
    async fn concurrent_opens_of_one_image_share_one_pull() {
        let pulls = Pulls::default();
        let started = Arc::new(AtomicUsize::new(0));
        let start = |image: &'static str| {
            let (pulls, started) = (pulls.clone(), started.clone());
            tokio::spawn(async move {
                pulls
                    .shared(image, move || {
                        started.fetch_add(1, Ordering::SeqCst);
                        async {
                            tokio::time::sleep(std::time::Duration::from_secs(5)).await;
                            Ok(5_000_000)
                        }
                        .boxed()
                    })
                    .await
            })
        };
        let (a, b, other) = (
            start("reg.example/a:1"),
            start("reg.example/a:1"),
            start("reg.example/b:1"),
        );
        tokio::task::yield_now().await;
        assert_eq!(pulls.running(), 2, "one pull per image");
        assert_eq!(a.await.unwrap().unwrap(), 5_000_000);
        assert_eq!(b.await.unwrap().unwrap(), 5_000_000);
        other.await.unwrap().unwrap();
        assert_eq!(
            started.load(Ordering::SeqCst),
            2,
            "a:1 pulled once for two opens"
        );
        assert_eq!(pulls.running(), 0, "finished pulls are forgotten");
        // A later open pulls again (the image may have been removed since).
        start("reg.example/a:1").await.unwrap().unwrap();
        assert_eq!(started.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn an_image_outside_the_allow_list_is_refused_before_any_pull() {
        let config = PullConfig {
            allow: vec![tangram_shared::image::ImageRule::parse("127.0.0.1:5000/team/*").unwrap()],
            ..Default::default()
        };
        assert!(config.refusal("127.0.0.1:5000/team/app:1").is_none());
        let why = config.refusal("127.0.0.1:5000/other/app:1").unwrap();
        assert!(why.contains("allow-list"), "{why}");
        assert!(config.refusal("Bad/Ref").is_some());
        assert!(PullConfig::default()
            .refusal("127.0.0.1:5000/team/app:1")
            .is_some());
    }

    #[test]
    fn an_unknown_image_is_refused_and_an_outage_is_a_failure() {
        let unknown = "Docker responded with status code 404: manifest for 127.0.0.1:5000/a:1 not found: manifest unknown";
        assert!(matches!(classify("a", unknown), PullError::Refused(_)));
        let down = "Docker responded with status code 500: Get \"http://127.0.0.1:5000/v2/\": dial tcp 127.0.0.1:5000: connect: connection refused";
        assert!(matches!(classify("a", down), PullError::Failed(_)));
        let auth = "Docker responded with status code 500: unauthorized: authentication required";
        assert!(matches!(classify("a", auth), PullError::Failed(_)));
    }
}
