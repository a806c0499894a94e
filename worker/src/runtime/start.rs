//! Starting a worker: its sandbox runtime (behind a warm pool when configured, what an
//! earlier run left removed), its GPUs, services and providers, its connection, and the tasks
//! it runs until shutdown; then the drain and a goodbye.

use super::*;

/// The sandbox runtime, behind a warm pool when the config asks for one (the pool's
/// filling loop is the caller's to run).
async fn sandbox_runtime(
    config: &Config,
) -> anyhow::Result<(Arc<dyn SandboxRuntime>, Option<Arc<WarmPool>>)> {
    let runtime: Arc<dyn SandboxRuntime> = match config.sandbox_runtime {
        RuntimeKind::Docker => Arc::new(
            DockerRuntime::connect(
                config.id.as_str(),
                config.sandbox.clone(),
                config.grant_mode,
            )
            .await
            .context("connecting to the Docker daemon")?,
        ),
        RuntimeKind::Noop => {
            warn!("sandbox_runtime = \"noop\": commands are NOT run, every exec reports exit 0 at once; for pipeline benchmarks only, never for real workloads");
            Arc::new(InMemorySandboxes::noop())
        }
    };
    runtime.validate().await.map_err(|e| match e {
        SandboxError::NoImage(image) => anyhow::anyhow!(
            "default sandbox image {image:?} is not present; build it with deploy/build-sandbox-image.sh"
        ),
        e => anyhow::Error::new(e).context("checking the sandbox runtime"),
    })?;
    // Whatever an earlier run of this worker left is unusable now (its cores and grants are
    // unknown). Actions that were running in it come back as redelivered dispatches and are
    // reported lost (their sandbox is gone).
    let removed = runtime.recover().await?;
    if removed > 0 {
        m::leftovers(removed);
        info!(
            count = removed,
            "removed leftover sandboxes of an earlier run"
        );
    }
    let sandbox = &config.sandbox;
    if sandbox.warm_max == 0 {
        return Ok((runtime, None));
    }
    info!(
        min = sandbox.warm_min,
        max = sandbox.warm_max,
        "keeping a warm pool of sandboxes"
    );
    let pool = Arc::new(WarmPool::new(
        runtime,
        &sandbox.image,
        &config.parking_cores,
        sandbox.warm_min,
        sandbox.warm_max,
    ));
    Ok((pool.clone(), Some(pool)))
}

/// Runs the worker until `shutdown` is cancelled, then drains within the grace period.
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    let (sandboxes, warm) = if config.sandboxes {
        let (rt, warm) = sandbox_runtime(&config).await?;
        (Some(rt), warm)
    } else {
        (None, None)
    };
    let inventory = crate::gpu::discover(&NvmlDiscovery, config.nvml, &config.gpu_groups)?;
    m::gpu_inventory(inventory.as_ref());
    // Use is read only where a driver reported the GPUs; a declared inventory has none.
    let sampler = match &inventory {
        Some(inv) if inv.source == "nvml" => match crate::gpu::NvmlSampler::open() {
            Ok(s) => Some(Arc::new(s) as Arc<dyn crate::gpu::GpuSampler>),
            Err(e) => {
                warn!(error = %e, "NVML answered the inventory but not the sampler: no GPU use metrics");
                None
            }
        },
        _ => None,
    };
    let services: Option<Arc<dyn ReplicaDriver>> = match (&inventory, config.services.is_empty()) {
        (_, true) => None,
        (None, false) => anyhow::bail!(
            "{} service(s) are configured but this worker has no GPUs: NVML found none and the config declares none ([gpu] groups or count)",
            config.services.len()
        ),
        (Some(inv), false) => {
            let s = Services::new(config.id.as_str(), config.services.clone(), inv.clone(), config.state_dir.clone());
            s.start().await.context("deploying model services")?;
            Some(Arc::new(s))
        }
    };

    let client = tangram_nats::auth::connect(
        &config.nats_url,
        &format!("tangram-worker-{}", config.id),
        &config.credentials,
    )
    .await?;
    let js = async_nats::jetstream::new(client.clone());
    if config.credentials.nkey_file.is_some() {
        // With NATS permissions, only the scheduler creates streams.
        tangram_nats::wait_for_streams(&js, Duration::from_secs(120)).await?;
    } else {
        tangram_nats::ensure_streams_exist(&js).await?;
    }
    let consumer = tangram_nats::worker_consumer(&js, &config.id).await?;

    let providers: Option<Arc<dyn ApiCaller>> = (!config.providers.is_empty())
        .then(|| Arc::new(Providers::new(config.providers.clone())) as Arc<dyn ApiCaller>);
    let worker = Arc::new(Worker::new(
        config,
        sandboxes,
        services,
        providers,
        Arc::new(JetStreamResults::new(js)),
        inventory,
    ));
    let instance = worker.instance();
    info!(worker = %worker.config.id, %instance, cores = %cpuset::format(&worker.config.cores), "worker starting");
    let published = worker.publish_kept().await;
    if published > 0 {
        info!(
            published,
            "results kept on disk by an earlier run published"
        );
    }

    // Heartbeats and health checks outlive intake: they stop after the drain.
    let background = TaskTracker::new();
    let background_stop = CancellationToken::new();
    background.spawn(
        heartbeat::heartbeats(worker.clone(), client.clone(), background_stop.clone())
            .instrument(tracing::info_span!("heartbeats")),
    );
    background.spawn(
        fence::watch(worker.clone(), background_stop.clone())
            .instrument(tracing::info_span!("fence")),
    );
    if worker.sandboxes.is_some() {
        background.spawn(
            prepull::serve(worker.clone(), client.clone(), background_stop.clone())
                .instrument(tracing::info_span!("prepull")),
        );
    }
    if let Some(pool) = warm {
        background.spawn(
            pool.run(background_stop.clone())
                .instrument(tracing::info_span!("warm_pool")),
        );
    }
    if let Some(sampler) = sampler {
        background.spawn(
            heartbeat::gpu_samples(sampler, worker.config.heartbeat, background_stop.clone())
                .instrument(tracing::info_span!("gpu_samples")),
        );
    }
    if let Some(svc) = worker.services.clone() {
        let stop = background_stop.clone();
        background.spawn(
            async move {
                let mut tick = tokio::time::interval(Duration::from_secs(1));
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        _ = tick.tick() => svc.check_health().await,
                    }
                }
            }
            .instrument(tracing::info_span!("health_checks")),
        );
    }

    if let Some(addr) = worker.config.health_addr {
        let (client, w) = (client.clone(), worker.clone());
        let check: tangram_health::Check = Arc::new(move || {
            let connected = client.connection_state() == async_nats::connection::State::Connected;
            let draining = w.draining.is_cancelled();
            let (running, sandboxes) = {
                let st = w.state.lock().expect("state lock");
                (st.admissions.running.len(), st.sandboxes.len())
            };
            tangram_health::Readiness {
                ready: connected && !draining,
                detail: serde_json::json!({
                    "component": "worker",
                    "worker": w.config.id.as_str(),
                    "instance": w.instance(),
                    "nats": if connected { "connected" } else { "disconnected" },
                    "draining": draining,
                    "running": running,
                    "sandboxes": sandboxes,
                }),
            }
        });
        tangram_health::serve(addr, check, background_stop.clone())
            .await
            .with_context(|| format!("binding the health endpoints on {addr}"))?;
    }
    let messages = consumer.messages().await?;
    let intake = messages.filter_map(|m| async move {
        match m {
            Ok(m) => Some(Box::new(m) as Box<dyn Delivery>),
            Err(e) => {
                warn!(error = %e, "dispatch consumer error");
                None
            }
        }
    });
    serve(worker.clone(), Box::pin(intake), shutdown).await;

    background_stop.cancel();
    background.close();
    // Every last step is bounded, so SIGTERM always ends the process even without NATS.
    let last_words = async {
        background.wait().await;
        heartbeat::send_heartbeat(&worker, &client, u64::MAX, true).await;
        client.flush().await.ok();
    };
    if tokio::time::timeout(GOODBYE_WAIT, last_words)
        .await
        .is_err()
    {
        warn!("could not say goodbye to NATS within 3 s");
    }
    info!("worker stopped");
    Ok(())
}
