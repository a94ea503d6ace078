//! `keyward-bench`: a load generator that speaks the etcd v3 gRPC API as a client, like etcd's own
//! `benchmark` tool, so the same command measures a keyward member and a real etcd.
//!
//! `--conns` HTTP/2 channels (plain `http://` or `https://` through tokio-rustls with `--cacert`,
//! `--cert`, `--key`) are shared round-robin by `--clients` tasks, each sending one request at a time.
//! With `--user`, every connection authenticates once and sends the token in `token` metadata on each
//! request, re-authenticating when the server says the token is stale. Every request's latency is
//! recorded (microseconds, per client), merged and sorted at the end: throughput, p50/p90/p99/max and
//! the errors by message are printed as text or, with `-w json`, as one JSON object.
//!
//! Workloads: `put`, `range` (`--consistency l|s`), `txn-put`, `watch` (events per second delivered
//! to N watchers), `authenticate`; any of them with `--idle-watchers` open and idle meanwhile; plus
//! helpers for the scripts in `benches/`: `setup-auth` (users, roles, many grants, auth enable) and
//! `bcrypt` (local bcrypt throughput, no server) for `compare.sh`; `probe` (a get and a put every
//! tick, reporting the longest wait of each: `probe.rs`) for `store-scale.sh`; and `ceiling-server`,
//! a Put-only server on keyward's front end with nothing behind it (`ceiling.rs`).

mod args;
mod ceiling;
mod conn;
mod idle_watchers;
mod probe;
mod report;
mod setup;
mod workloads;

use std::process::ExitCode;

use clap::Parser;

use args::{BenchArgs, OutputFormat, Workload};

#[derive(Parser, Debug)]
#[command(
    name = "keyward-bench",
    version,
    about = "Load-generate against etcd v3 endpoints (keyward or etcd), like etcd's `benchmark` tool"
)]
struct Cli {
    #[command(flatten)]
    args: BenchArgs,
}

fn main() -> ExitCode {
    run(Cli::parse().args)
}

/// Runs `keyward-bench` to completion; the exit status is 0 when at least one request succeeded
/// (errors are reported, not fatal), 1 when none did or the setup failed, 2 on invalid options.
fn run(args: BenchArgs) -> ExitCode {
    if let Err(e) = args::validate(&args) {
        eprintln!("keyward-bench: {e}");
        return ExitCode::from(2);
    }
    if let Workload::Bcrypt { cost } = args.workload {
        return finish(setup::bcrypt(&args, cost), &args);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("keyward-bench: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match &args.workload {
            Workload::SetupAuth { root_password, new_users, enable } => {
                setup::setup_auth(&args, root_password, new_users, *enable).await.map(|()| None)
            }
            Workload::CeilingServer { listen } => ceiling::serve(*listen).await.map(|()| None),
            Workload::Probe(probe) => probe::run(&args, probe).await.map(|()| None),
            _ => workloads::run(&args).await.map(Some),
        }
    });
    match result {
        Ok(Some(summary)) => finish(Ok(summary), &args),
        Ok(None) => ExitCode::SUCCESS,
        Err(e) => finish(Err(e), &args),
    }
}

fn finish(result: anyhow::Result<report::Summary>, args: &BenchArgs) -> ExitCode {
    match result {
        Ok(summary) => {
            match args.write_out {
                OutputFormat::Simple => print!("{}", summary.to_text()),
                OutputFormat::Json => println!("{}", summary.to_json()),
            }
            if summary.ok == 0 {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!("keyward-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}
