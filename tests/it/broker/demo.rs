//! The quick start works: README's commands run verbatim, and `scripts/demo --check` publishes
//! sample orders and sees their runs.

use std::process::Command;

use crate::support::{binary, repo};

#[tokio::test]
async fn demo_script_shows_runs_starting() {
    let out = tokio::task::spawn_blocking(|| {
        Command::new(repo().join("scripts/demo"))
            .arg("--check")
            .env("TESSEL_KAFKA_BIN", binary())
            .env(
                "DEMO_DISPATCHER_PORT",
                crate::support::free_port().to_string(),
            )
            .env("DEMO_ADMIN_PORT", crate::support::free_port().to_string())
            .env("DEMO_COUNT", "12")
            .output()
            .expect("run scripts/demo")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "scripts/demo failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout
            .lines()
            .filter(|l| l.starts_with("run accepted workflow=process-order"))
            .count(),
        12,
        "{stdout}"
    );
    assert!(stdout.contains("OK: 12 orders started 12 runs"));
}

#[tokio::test]
async fn demo_script_with_batches_shows_every_order_of_each_batch() {
    let out = tokio::task::spawn_blocking(|| {
        Command::new(repo().join("scripts/demo"))
            .args(["--check", "--batch"])
            .env("TESSEL_KAFKA_BIN", binary())
            .env(
                "DEMO_DISPATCHER_PORT",
                crate::support::free_port().to_string(),
            )
            .env("DEMO_ADMIN_PORT", crate::support::free_port().to_string())
            .env("DEMO_COUNT", "25")
            .output()
            .expect("run scripts/demo --batch")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "scripts/demo --batch failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout
            .lines()
            .filter(|l| l.starts_with("run accepted (batch) workflow=process-order"))
            .count(),
        25,
        "{stdout}"
    );
    assert!(stdout.contains("OK: 25 orders started 25 runs"));
}

/// The commands of README's quick start, verbatim: the first `sh` block under "Quick start".
fn readme_quick_start() -> Vec<String> {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let section = &readme[readme
        .find("## Quick start")
        .expect("a Quick start section")..];
    let block = &section[section.find("```sh\n").expect("an sh block") + 6..];
    let block = &block[..block.find("```").expect("the block ends")];
    block
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect()
}

/// README's quick start, run as written: it prints a line per run for the 20 sample orders,
/// and stopping the script stops everything it started.
#[tokio::test]
async fn readme_quick_start_runs_verbatim() {
    use std::io::BufRead as _;
    let commands = readme_quick_start();
    assert_eq!(
        commands,
        vec!["scripts/demo".to_owned()],
        "the test knows this quick start"
    );
    let dispatcher_port = crate::support::free_port();
    let admin_port = crate::support::free_port();
    let mut child = Command::new("bash")
        .arg("-c")
        .arg(&commands[0])
        .current_dir(repo())
        .env("TESSEL_KAFKA_BIN", binary())
        .env("DEMO_DISPATCHER_PORT", dispatcher_port.to_string())
        .env("DEMO_ADMIN_PORT", admin_port.to_string())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run the quick start");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(240);
    let mut runs = Vec::new();
    while runs.len() < 20 {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line.starts_with("run accepted workflow=process-order") => runs.push(line),
            Ok(_) => {}
            Err(e) => {
                let _ = child.kill();
                panic!("{} of 20 runs before {e:?}: {runs:#?}", runs.len());
            }
        }
    }
    // Stop it: SIGTERM to the script alone (bash -c execs a single command). Not SIGINT: a
    // shell started from a background job ignores SIGINT, and bash cannot trap a signal
    // ignored at entry; the script traps INT and TERM alike.
    assert!(Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill")
        .success());
    let status = tokio::task::spawn_blocking(move || child.wait().expect("wait"))
        .await
        .unwrap();
    assert!(!status.success(), "stopped, not finished: {status:?}");
    reader.join().expect("reader");
    // What the demo started is gone: both ports can be bound again.
    crate::support::wait_for(
        "the demo's dispatcher and connector to stop",
        std::time::Duration::from_secs(60),
        || {
            let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
            (free(dispatcher_port) && free(admin_port)).then_some(())
        },
    )
    .await;
    assert!(runs.iter().any(|r| r.contains("key=\"ada\"")), "{runs:#?}");
}
