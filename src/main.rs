//! `keyward`: command-line entry point.

use std::process::ExitCode;

use clap::Parser;
use keyward::{Cli, Command, GrpcProxyCommand};

/// See Cargo.toml: allocation is a sixth of a busy member's CPU.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse_from(keyward::etcd_style_args(std::env::args_os()));
    match cli.command {
        Command::Serve(args) => {
            let config = match args.into_config() {
                Ok(config) => config,
                Err(e) => {
                    eprintln!("keyward: {e}");
                    return ExitCode::from(2);
                }
            };
            if let Err(e) = keyward::init_logging(config.log_filter, &config.log) {
                eprintln!("keyward: {e}");
                return ExitCode::from(2);
            }
            let stderr_logged = config.log.writes_to_stderr();
            run(keyward::serve(config), stderr_logged)
        }
        Command::GrpcProxy(GrpcProxyCommand::Start(args)) => {
            let config = match args.into_config() {
                Ok(config) => config,
                Err(e) => {
                    eprintln!("keyward grpc-proxy: {e}");
                    return ExitCode::from(2);
                }
            };
            let log = keyward::LogSettings::default();
            if let Err(e) = keyward::init_logging(config.log_filter, &log) {
                eprintln!("keyward grpc-proxy: {e}");
                return ExitCode::from(2);
            }
            run(keyward::grpc_proxy(config), log.writes_to_stderr())
        }
        Command::Snapshot(command) => {
            let _ = keyward::init_logging("warn", &keyward::LogSettings::default());
            report("keyward snapshot", keyward::snapshot(command))
        }
        Command::Migrate(args) => {
            let _ = keyward::init_logging("warn", &keyward::LogSettings::default());
            report("keyward migrate", keyward::migrate(*args))
        }
    }
}

/// Runs `task` on a multi-threaded runtime; its error is logged and makes the exit status 1. The error
/// is printed to stderr as well only when the log does not already go there, so it appears once.
fn run(task: impl std::future::Future<Output = anyhow::Result<()>>, stderr_logged: bool) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("keyward: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(task) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            if !stderr_logged {
                eprintln!("keyward: {e:#}");
            }
            ExitCode::FAILURE
        }
    }
}

/// A one-shot command's outcome: its error printed once, naming the command; exit status 1.
fn report(command: &str, result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{command}: {e:#}");
            ExitCode::FAILURE
        }
    }
}
