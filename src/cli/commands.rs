//! The binary's commands: what `tessel-kafka <command>` does, mapped to an exit code.

use std::process::ExitCode;

use crate::cli::dev_dispatcher::bench::BenchDispatcher;
use crate::cli::dev_dispatcher::{DevDispatcher, Faults};
use crate::cli::{Cli, Command, ConfigCommand, DlqCommand, OffsetsCommand};
use crate::config::{Config, LogConfig, LogFormat};
use crate::ops::tools;
use crate::{app::App, shutdown, telemetry};
use tokio_util::sync::CancellationToken;

/// Runs the command `cli` names.
pub async fn execute(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Run { config: path } => {
            let config = match Config::load(&path) {
                Ok(c) => c,
                Err(e) => return fatal(log_format_of(&path), &e.to_string()),
            };
            let format = config.log.format;
            let traces = telemetry::init_tracing(&config.log, config.otlp.as_ref());
            for notice in config.notices() {
                tracing::info!(notice = %notice, "configuration translated");
            }
            let token = CancellationToken::new();
            shutdown::spawn_signal_handler(token.clone());
            let result = match App::build(config) {
                Ok(app) => app.reloading_from(&path).run(token, true).await,
                Err(e) => Err(e.into()),
            };
            let _ = tokio::task::spawn_blocking(move || traces.shutdown()).await;
            match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fatal(format, &one_line(&e)),
            }
        }
        Command::Config {
            command: ConfigCommand::Check { config, json },
        } => match Config::load(&config) {
            Ok(c) if json => {
                print_json(&serde_json::json!({ "notices": c.notices(), "config": c }))
            }
            Ok(c) => {
                println!("# configuration is valid; effective values, secrets redacted");
                for notice in c.notices() {
                    println!("# note: {notice}");
                }
                println!();
                print!("{}", toml::to_string_pretty(&c).unwrap_or_default());
                ExitCode::SUCCESS
            }
            Err(e) => fail(&e.to_string()),
        },
        Command::Check { config, json } => check_command(&config, json).await,
        Command::Ctl(args) => super::ctl::run(args).await,
        Command::Offsets { command } => tools_command(command).await,
        Command::Produce(args) => {
            let config = match Config::load(&args.config) {
                Ok(c) => c,
                Err(e) => return fail(&e.to_string()),
            };
            warnings_only(&config);
            match super::produce::run(&config, &args).await {
                Ok(summary) => {
                    eprintln!("{summary}");
                    ExitCode::SUCCESS
                }
                Err(e) => fail_with(&e),
            }
        }
        Command::Dlq {
            command:
                DlqCommand::Replay {
                    config,
                    connection,
                    trigger,
                    partitions,
                    from,
                    to,
                    dry_run,
                    json,
                },
        } => {
            let request = crate::ops::replay::ReplayRequest {
                trigger,
                partitions,
                from,
                to,
                dry_run,
            };
            dlq_replay_command(&config, connection.as_deref(), &request, json).await
        }
        Command::DevDispatcher {
            listen,
            latency_ms,
            fail_ratio,
            fail_status,
            bench,
        } => {
            let _ = telemetry::init_tracing(&LogConfig::default(), None);
            let token = CancellationToken::new();
            shutdown::spawn_signal_handler(token.clone());
            if bench {
                let hold = std::time::Duration::from_millis(latency_ms);
                return match BenchDispatcher::start(listen, hold, token.clone()).await {
                    Ok(d) => {
                        println!("dev dispatcher (bench) listening on {}", d.url());
                        token.cancelled().await;
                        ExitCode::SUCCESS
                    }
                    Err(e) => fail(&format!("cannot listen on {listen}: {e}")),
                };
            }
            let faults = Faults {
                latency_ms: (latency_ms, latency_ms),
                fail_ratio,
                fail_status,
                ..Faults::default()
            };
            match DevDispatcher::start(listen, faults, true, token.clone()).await {
                Ok(d) => {
                    println!("dev dispatcher listening on {}", d.url());
                    token.cancelled().await;
                    ExitCode::SUCCESS
                }
                Err(e) => fail(&format!("cannot listen on {listen}: {e}")),
            }
        }
        Command::DevHttpLoad {
            url,
            body,
            headers,
            connections,
            seconds,
            key_prefix,
        } => {
            let body = match std::fs::read(&body) {
                Ok(b) => b,
                Err(e) => return fail(&format!("cannot read {}: {e}", body.display())),
            };
            let mut extra = std::collections::BTreeMap::new();
            for h in headers {
                let Some((name, value)) = h.split_once(':') else {
                    return fail(&format!("--header {h:?}: expected `name: value`"));
                };
                let _ = extra.insert(name.trim().to_owned(), value.trim().to_owned());
            }
            let load = crate::cli::http_load::Load {
                url,
                headers: extra,
                body,
                connections,
                duration: std::time::Duration::from_secs_f64(seconds.max(0.0)),
                key_prefix,
            };
            match load.run().await {
                Ok(report) => {
                    println!("{}", serde_json::to_string(&report).unwrap_or_default());
                    ExitCode::SUCCESS
                }
                Err(e) => fail(&e),
            }
        }
    }
}

async fn tools_command(command: OffsetsCommand) -> ExitCode {
    match command {
        OffsetsCommand::Show {
            config,
            connection,
            json,
        } => {
            let result = Config::load(&config)
                .map_err(anyhow::Error::from)
                .and_then(|c| tools::offsets_show(&c, connection.as_deref()));
            match result {
                Ok(rows) if json => print_json(&rows),
                Ok(rows) => {
                    println!(
                        "{:<40} {:>9} {:>12} {:>12} {:>12} {:>10}",
                        "topic", "partition", "committed", "low", "high", "lag"
                    );
                    for r in rows {
                        let committed = r.committed.map_or("-".to_owned(), |c| c.to_string());
                        println!(
                            "{:<40} {:>9} {:>12} {:>12} {:>12} {:>10}",
                            r.topic,
                            r.partition,
                            committed,
                            r.low_watermark,
                            r.high_watermark,
                            r.lag
                        );
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => fail_with(&e),
            }
        }
        OffsetsCommand::Reset {
            config,
            connection,
            to,
            topic,
            partitions,
            execute,
            json,
        } => {
            let request = tools::ResetRequest {
                to,
                topic,
                partitions,
                execute,
            };
            let result = Config::load(&config)
                .map_err(anyhow::Error::from)
                .and_then(|c| tools::offsets_reset(&c, connection.as_deref(), &request));
            match result {
                Ok(report) if json => print_json(&report),
                Ok(report) => {
                    print!("{}", render_reset(&report));
                    if report.executed {
                        eprintln!("committed the planned offsets of group {}", report.group);
                    } else {
                        eprintln!(
                            "dry run: nothing was written; add --execute to commit the planned \
                             offsets of group {}{}",
                            report.group,
                            if report.active_members > 0 {
                                format!(
                                    " (refused while its {} active member(s) consume)",
                                    report.active_members
                                )
                            } else {
                                String::new()
                            }
                        );
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => fail_with(&e),
            }
        }
    }
}

/// `dlq replay`: a line (or a JSON array element) per record as soon as it is settled, a
/// summary on stderr; fails unless every record was accepted (or, in a dry run, would be
/// sent).
async fn dlq_replay_command(
    path: &std::path::Path,
    connection: Option<&str>,
    request: &crate::ops::replay::ReplayRequest,
    json: bool,
) -> ExitCode {
    use std::io::Write as _;
    let config = match Config::load(path) {
        Ok(c) => c,
        Err(e) => return fail(&e.to_string()),
    };
    // Retries and registry trouble are logged on stderr.
    warnings_only(&config);
    let mut first = true;
    let emit = |r: &crate::ops::replay::Replayed| {
        let line = if json {
            let sep = if first { "[\n  " } else { ",\n  " };
            format!("{sep}{}", serde_json::to_string(r).unwrap_or_default())
        } else {
            format!(
                "{}\t{}\t{}\t{}\t{}\n",
                r.dead_letter_partition,
                r.dead_letter_offset,
                r.idempotency_key,
                r.outcome,
                r.request_key.as_deref().unwrap_or("-")
            )
        };
        first = false;
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(line.as_bytes());
        let _ = out.flush();
    };
    let result = crate::ops::replay::dlq_replay(&config, connection, request, emit).await;
    if json {
        println!("{}", if first { "[]" } else { "\n]" });
    }
    match result {
        Ok(s) if s.dry_run => {
            eprintln!(
                "dry run: nothing was sent; {} record(s) would go in {} request(s){}",
                s.records,
                s.requests,
                if s.failed > 0 {
                    format!(", {} could not be", s.failed)
                } else {
                    String::new()
                }
            );
            if s.failed == 0 {
                ExitCode::SUCCESS
            } else {
                fail(&format!("{} record(s) cannot be replayed", s.failed))
            }
        }
        Ok(s) => {
            eprintln!(
                "replayed {} record(s) of partition(s) {:?} in {} request(s): {} accepted",
                s.records, s.partitions, s.requests, s.accepted
            );
            if s.failed == 0 {
                ExitCode::SUCCESS
            } else {
                fail(&format!("{} record(s) were not accepted", s.failed))
            }
        }
        Err(e) => fail_with(&e),
    }
}

/// The plan of `offsets reset` as a table: one line per partition.
fn render_reset(report: &tools::ResetReport) -> String {
    let mut out = format!(
        "{:<40} {:>9} {:>12} {:>12}\n",
        "topic", "partition", "current", "planned"
    );
    for r in &report.partitions {
        let current = r.current.map_or("-".to_owned(), |c| c.to_string());
        out.push_str(&format!(
            "{:<40} {:>9} {:>12} {:>12}\n",
            r.topic, r.partition, current, r.planned
        ));
    }
    out
}

async fn check_command(config: &std::path::Path, json: bool) -> ExitCode {
    let config = match Config::load(config) {
        Ok(c) => c,
        Err(e) => return fail(&e.to_string()),
    };
    // The report is the output; the client's own log only when asked for (RUST_LOG).
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = telemetry::init_tracing(&config.log, None);
    }
    let lines = crate::ops::check::run(&config).await;
    let out = if json {
        format!(
            "{}\n",
            serde_json::to_string_pretty(&lines).unwrap_or_default()
        )
    } else {
        let notes: String = config
            .notices()
            .iter()
            .map(|n| format!("# note: {n}\n"))
            .collect();
        notes + &crate::ops::check::render_table(&lines)
    };
    // A closed pipe (`check | head`) is not an error of the check.
    let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), out.as_bytes());
    let failed = lines
        .iter()
        .filter(|l| l.status == crate::ops::check::CheckStatus::Fail)
        .count();
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        eprintln!("error: {failed} check(s) failed");
        ExitCode::FAILURE
    }
}

/// A tool's log: warnings and errors only, on stderr, in the configured format.
fn warnings_only(config: &Config) {
    let _ = telemetry::init_tracing(
        &LogConfig {
            level: "warn".to_owned(),
            ..config.log.clone()
        },
        None,
    );
}

/// A command's result as pretty JSON on stdout: success.
fn print_json(value: &impl serde::Serialize) -> ExitCode {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_default()
    );
    ExitCode::SUCCESS
}

fn fail(message: &str) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::FAILURE
}

/// An error and its causes on one line, each cause once (an OS error its wrapper already
/// prints is not repeated), URLs redacted.
fn one_line(e: &anyhow::Error) -> String {
    crate::config::redacted_error_chain(e.as_ref())
}

fn fail_with(e: &anyhow::Error) -> ExitCode {
    fail(&one_line(e))
}

/// The daemon's last words, in its log format: a JSON log line (level ERROR, the message,
/// `fatal: true`) when the logs are JSON, so that a log pipeline parses a crash-looping pod's
/// reason like any other line; `error: <message>` otherwise.
fn fatal(format: LogFormat, message: &str) -> ExitCode {
    match format {
        LogFormat::Text => fail(message),
        LogFormat::Json => {
            // Installs the JSON log if the daemon had not yet (a config that does not load);
            // otherwise the daemon's own subscriber writes the line.
            let _ = telemetry::init_tracing(
                &LogConfig {
                    format: LogFormat::Json,
                    level: "error".to_owned(),
                },
                None,
            );
            tracing::error!(fatal = true, "{message}");
            ExitCode::FAILURE
        }
    }
}

/// The log format a configuration that does not load asks for, as far as it can be read:
/// `log.format` of the file (when it is TOML at all), or `TESSEL_KAFKA__LOG__FORMAT`, which
/// wins as it would in a loaded configuration. Text when neither says JSON.
fn log_format_of(path: &std::path::Path) -> LogFormat {
    let from_env = std::env::var(format!("{}__LOG__FORMAT", crate::config::ENV_PREFIX)).ok();
    let from_file = || {
        let doc: toml::Table = std::fs::read_to_string(path).ok()?.parse().ok()?;
        doc.get("log")?.get("format")?.as_str().map(str::to_owned)
    };
    match from_env.or_else(from_file).as_deref().map(str::trim) {
        Some("json") => LogFormat::Json,
        _ => LogFormat::Text,
    }
}
