//! The container image, run for real (feature `image-tests`; `scripts/image-test` builds the
//! image and runs this with `TESSEL_IT_IMAGE` naming it). The container runs as the
//! Kubernetes manifests run it (non-root, read-only root filesystem, no capabilities, no
//! privilege escalation) on the host's network against the local stack: it answers
//! `/healthz` and `/readyz`, dispatches records, and on `podman stop` (SIGTERM) lets the runs
//! in flight finish, commits them and exits 0.

use std::process::Command;
use std::time::Duration;

use tessel_kafka::cli::dev_dispatcher::Faults;

use super::{committed, create_topic, dispatcher, produce_keyed};
use crate::config_builder::TestConfig;
use crate::support::{free_port, stack, temp_config, unique, wait_for, wait_for_async};

/// The image under test; the test fails (never skips) without it.
fn image() -> String {
    std::env::var("TESSEL_IT_IMAGE").unwrap_or_else(|_| {
        panic!("TESSEL_IT_IMAGE is not set: run the image test with scripts/image-test")
    })
}

/// `podman <args>`, its stdout on success; panics with stderr otherwise.
fn podman(args: &[&str]) -> String {
    let out = Command::new("podman")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("podman {args:?}: {e} (scripts/deps --image installs it)"));
    assert!(
        out.status.success(),
        "podman {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A started container, removed when the test ends however it ends.
struct Container {
    name: String,
}

impl Container {
    fn logs(&self) -> String {
        let out = Command::new("podman")
            .args(["logs", &self.name])
            .output()
            .expect("podman logs");
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("podman")
            .args(["rm", "--force", "--time", "0", &self.name])
            .output();
    }
}

async fn status_of(url: &str) -> Option<u16> {
    reqwest::get(url).await.ok().map(|r| r.status().as_u16())
}

// Multi-threaded: the dispatcher must keep answering while podman calls block.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_runs_non_root_dispatches_and_drains_and_commits_on_stop() {
    let image = image();
    let topic = unique("image");
    create_topic(&topic, 1).await;
    // Slow answers, so that runs are in flight when the container is stopped.
    let d = dispatcher(Faults {
        latency_ms: (1500, 1500),
        ..Faults::default()
    })
    .await;
    let group = unique("image-group");
    let port = free_port();
    let config = temp_config(
        &TestConfig::new(&stack().bootstrap, &group, &topic, &d.url())
            .server(&format!("127.0.0.1:{port}"))
            .connection("drain_timeout_ms", "20000")
            .trigger("concurrency", "4")
            .trigger("ordering", "\"unordered\"")
            .trigger("value_format", "\"json\"")
            .toml(),
    );
    let name = unique("tessel-kafka-image");
    let mount = format!("{}:/etc/tessel-kafka/config.toml:ro", config.display());
    podman(&[
        "run",
        "--detach",
        "--name",
        &name,
        "--network",
        "host",
        "--read-only",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "--volume",
        &mount,
        &image,
    ]);
    let container = Container { name: name.clone() };

    // Non-root: the image's user, and the uid the daemon runs with.
    assert_eq!(
        podman(&["image", "inspect", "--format", "{{.Config.User}}", &image]),
        "10001"
    );
    let status = podman(&["exec", &name, "cat", "/proc/1/status"]);
    let uids = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .expect("Uid line");
    assert!(
        uids.split_whitespace().all(|u| u == "10001"),
        "daemon runs as {uids}"
    );

    let base = format!("http://127.0.0.1:{port}");
    wait_for_async("/healthz answers 200", Duration::from_secs(60), || async {
        (status_of(&format!("{base}/healthz")).await == Some(200)).then_some(())
    })
    .await;
    wait_for_async("/readyz answers 200", Duration::from_secs(60), || async {
        (status_of(&format!("{base}/readyz")).await == Some(200)).then_some(())
    })
    .await;

    produce_keyed(&topic, 0, 12, 12).await;
    wait_for(
        "runs in flight at the dispatcher",
        Duration::from_secs(60),
        || (d.in_flight() > 0).then_some(()),
    )
    .await;
    // SIGTERM (the image's STOPSIGNAL); 60 s before podman would kill it.
    let stopping = name.clone();
    tokio::task::spawn_blocking(move || podman(&["stop", "--time", "60", &stopping]))
        .await
        .expect("podman stop");
    let logs = container.logs();
    let exit = podman(&["inspect", "--format", "{{.State.ExitCode}}", &name]);
    assert_eq!(exit, "0", "the container exits 0 after SIGTERM: {logs}");
    assert!(
        logs.contains("stopping: draining runs in flight"),
        "no drain: {logs}"
    );
    // Every run started before the stop finished and was committed: the committed offset
    // counts exactly the accepted runs (offsets 0.. without a gap), none after.
    let accepted = d.accepted();
    assert!(accepted > 0, "nothing accepted: {logs}");
    assert_eq!(d.in_flight(), 0, "a run was left in flight: {logs}");
    assert_eq!(
        committed(&group, &topic, 1),
        vec![accepted as i64],
        "committed offset vs {accepted} accepted runs: {logs}"
    );
    println!("image {image}: {accepted} runs accepted by the stop, committed offset {accepted}");
}
