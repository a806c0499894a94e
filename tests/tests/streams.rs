//! Operators own the stream configuration: what a process finds stored is left as it is.

use async_nats::jetstream;
use tangram_nats::streams::{StreamLimits, StreamSettings};
use tangram_tests::NatsServer;

/// Regression: every process re-applied its built-in stream configuration at start, silently
/// undoing an operator's edit (for example a larger `max_bytes` made with `nats stream edit`).
#[tokio::test]
async fn an_operators_stream_edit_survives_a_restart_and_is_reported_as_drift() -> anyhow::Result<()>
{
    let nats = NatsServer::start();
    let client = async_nats::connect(nats.url()).await?;
    let js = jetstream::new(client);
    let settings = StreamSettings {
        limits: [(
            "results".to_string(),
            StreamLimits {
                max_bytes: Some(64 << 20),
                ..Default::default()
            },
        )]
        .into(),
        ..Default::default()
    };
    // First start: everything is created, as configured.
    let drift = tangram_nats::ensure_streams(&js, &settings).await?;
    assert!(drift.is_empty(), "{drift:?}");
    let mut results = js.get_stream("TANGRAM_RESULTS").await?;
    assert_eq!(results.info().await?.config.max_bytes, 64 << 20);

    // The operator doubles the actions stream.
    let mut actions = js.get_stream("TANGRAM_ACTIONS").await?;
    let mut edited = actions.info().await?.config.clone();
    edited.max_bytes *= 2;
    js.update_stream(&edited).await?;

    // Next start: the edit stays, and is reported.
    let drift = tangram_nats::ensure_streams(&js, &settings).await?;
    assert_eq!(drift.len(), 1, "{drift:?}");
    assert_eq!(
        (drift[0].stream.as_str(), drift[0].field),
        ("TANGRAM_ACTIONS", "max_bytes")
    );
    assert_eq!(actions.info().await?.config.max_bytes, edited.max_bytes);
    Ok(())
}

/// Three replicas on a single server cannot be created: the error names the stream.
#[tokio::test]
async fn replicas_a_single_server_cannot_hold_are_a_clear_error() -> anyhow::Result<()> {
    let nats = NatsServer::start();
    let client = async_nats::connect(nats.url()).await?;
    let js = jetstream::new(client);
    let settings = StreamSettings {
        replicas: Some(3),
        ..Default::default()
    };
    let err = tangram_nats::ensure_streams(&js, &settings)
        .await
        .expect_err("R3 on one server");
    assert!(err.to_string().contains("TANGRAM_ACTIONS"), "{err}");
    Ok(())
}

/// A fleet's URL lists its servers: the client starts with whichever answers.
#[tokio::test]
async fn a_list_of_servers_connects_to_the_one_that_answers() -> anyhow::Result<()> {
    let nats = NatsServer::start();
    let dead = tangram_tests::free_port();
    let url = format!("nats://127.0.0.1:{dead}, {}", nats.url());
    let client = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        tangram_nats::auth::connect(&url, "list", &Default::default()),
    )
    .await??;
    client.flush().await?;
    Ok(())
}
