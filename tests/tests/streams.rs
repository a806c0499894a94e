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

/// Regression: a process whose stream lookup failed (on a three-node cluster, while a new
/// stream elects its leader) created the stream itself, lost the race to the scheduler, and
/// failed on "stream name already in use" instead of taking the stream as there: the check
/// read the error's source, where the client never puts the server's error.
#[tokio::test]
async fn a_stream_created_meanwhile_with_other_settings_counts_as_there() -> anyhow::Result<()> {
    let nats = NatsServer::start();
    let js = jetstream::new(async_nats::connect(nats.url()).await?);
    tangram_nats::ensure_streams(&js, &StreamSettings::default()).await?;
    // What a worker or rollout would create: the bundled definition, with other limits than
    // the stored one (the scheduler's replicas and byte limits differ in a real cluster).
    let mut config = js
        .get_stream("TANGRAM_HISTORY")
        .await?
        .info()
        .await?
        .config
        .clone();
    config.max_bytes /= 2;
    let err = js
        .create_stream(config)
        .await
        .expect_err("the stream exists with other settings");
    assert!(tangram_nats::created_meanwhile(&err), "{err:?}");
    // And a stream that cannot be created for another reason is not taken as there.
    let err = js
        .create_stream(jetstream::stream::Config {
            name: "TANGRAM_OVERLAP".into(),
            subjects: vec!["tangram.v1.action.>".into()],
            ..Default::default()
        })
        .await
        .expect_err("subjects overlap the actions stream");
    assert!(!tangram_nats::created_meanwhile(&err), "{err:?}");
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
