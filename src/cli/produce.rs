//! `tessel-kafka produce`: the produce path for operators. Same request shape, encoding and
//! checks as the API; no token, since whoever holds the configuration holds its credentials.

use std::io::BufRead;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use serde_json::{json, Map, Value as Json};

use crate::cli::ProduceArgs;
use crate::config::Config;
use crate::consumer::supervisor::SharedClients;
use crate::produce::{parse_value, Publisher};

/// Writes the records `args` describe; returns a summary line.
pub(super) async fn run(config: &Config, args: &ProduceArgs) -> anyhow::Result<String> {
    let (name, conn) = match &args.connection {
        Some(n) => (
            n.as_str(),
            config
                .connections
                .get(n)
                .with_context(|| format!("unknown connection {n:?}"))?,
        ),
        None if config.connections.len() == 1 => {
            let (n, c) = config.connections.iter().next().expect("one connection");
            (n.as_str(), c)
        }
        None => bail!("the file has several connections; name one with --connection"),
    };
    if args.batch == 0 {
        bail!("--batch must be at least 1");
    }
    let shared = SharedClients::try_new(name, conn, true)?;
    let producer = shared.producer.clone().context("no producer")?;
    let publisher = Arc::new(Publisher::new(
        name,
        conn,
        producer,
        shared.registry.clone(),
    ));

    let mut defaults = Map::new();
    if let Some(t) = &args.topic {
        let _ = defaults.insert("topic".into(), json!(t));
    }
    if let Some(f) = &args.value_format {
        let _ = defaults.insert("value_format".into(), json!(f));
    }
    let started = Instant::now();
    let mut written = 0_usize;
    if let Some(value) = &args.value {
        let value: Json = serde_json::from_str(value).context("--value is not JSON")?;
        let mut headers = Map::new();
        for h in &args.headers {
            let (k, v) = h.split_once('=').context("--header takes name=value")?;
            let _ = headers.insert(k.to_owned(), json!(v));
        }
        let mut m = Map::new();
        let _ = m.insert("value".into(), value);
        if let Some(k) = &args.key {
            let _ = m.insert("key".into(), json!(k));
        }
        let _ = m.insert("headers".into(), Json::Object(headers));
        written += send(&publisher, &defaults, vec![Json::Object(m)], args).await?;
    } else {
        let reader: Box<dyn BufRead> = if args.input.as_os_str() == "-" {
            Box::new(std::io::BufReader::new(std::io::stdin()))
        } else {
            Box::new(std::io::BufReader::new(
                std::fs::File::open(&args.input)
                    .with_context(|| format!("cannot open {}", args.input.display()))?,
            ))
        };
        let mut chunk = Vec::with_capacity(args.batch);
        for (n, line) in reader.lines().enumerate() {
            let line = line.context("cannot read input")?;
            if line.trim().is_empty() {
                continue;
            }
            let record: Json = serde_json::from_str(&line)
                .with_context(|| format!("line {} is not JSON", n + 1))?;
            chunk.push(record);
            if chunk.len() == args.batch {
                written += send(&publisher, &defaults, std::mem::take(&mut chunk), args).await?;
            }
        }
        if !chunk.is_empty() {
            written += send(&publisher, &defaults, chunk, args).await?;
        }
    }
    let secs = started.elapsed().as_secs_f64();
    Ok(format!(
        "{written} records written to connection {name} in {secs:.2} s ({:.0} records/s)",
        written as f64 / secs.max(1e-9)
    ))
}

async fn send(
    publisher: &Publisher,
    defaults: &Map<String, Json>,
    records: Vec<Json>,
    args: &ProduceArgs,
) -> anyhow::Result<usize> {
    let mut batch = defaults.clone();
    let _ = batch.insert("messages".into(), Json::Array(records));
    let _ = batch.insert("transactional".into(), json!(args.transactional));
    let request = parse_value(&Json::Object(batch), usize::MAX)?;
    match publisher
        .publish(&request.messages, request.transactional)
        .await
    {
        Ok(written) => {
            if !args.quiet {
                let mut out = std::io::stdout().lock();
                for w in &written {
                    use std::io::Write as _;
                    writeln!(out, "{}", serde_json::to_string(w)?)?;
                }
            }
            Ok(written.len())
        }
        Err(e) => {
            if let Some(results) = e.results() {
                for r in results {
                    println!("{}", serde_json::to_string(r)?);
                }
            }
            bail!("{e} (HTTP-equivalent status {})", e.status())
        }
    }
}
