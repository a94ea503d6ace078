//! Go-style flags (`-name value`), which etcd takes and clap does not, rewritten before clap parses.

use super::Cli;

/// Go's flag package (and so etcd) accepts `-name value` as well as `--name value`; operators' scripts
/// use both. Rewrites single-dash long flags to the double-dash form clap expects — only in flag
/// positions: the value after a flag that takes one is passed on untouched, even when it starts with
/// `-` (as Go takes it; it is joined to its flag as `--flag=-value` so clap does too). Stops at `--`.
pub fn etcd_style_args(args: impl IntoIterator<Item = std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    use clap::CommandFactory;
    go_style_args(Cli::command(), args)
}

fn go_style_args(
    mut command: clap::Command,
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> Vec<std::ffi::OsString> {
    command.build();
    let mut args = args.into_iter();
    let mut out: Vec<std::ffi::OsString> = args.next().into_iter().collect(); // the program name
    let mut command = &command;
    while let Some(arg) = args.next() {
        let Some(s) = arg.to_str() else {
            out.push(arg);
            continue;
        };
        if s == "--" {
            out.push(arg);
            out.extend(args);
            break;
        }
        let long = match s.strip_prefix("--") {
            Some(rest) => rest,
            None if s.len() > 2 && s.starts_with('-') && s.as_bytes()[1].is_ascii_alphabetic() => &s[1..],
            None => {
                // A short flag (`-h`) or a positional: a subcommand name moves to that subcommand's flags.
                if let Some(sub) = command.find_subcommand(s) {
                    command = sub;
                }
                out.push(arg);
                continue;
            }
        };
        let (name, inline_value) = match long.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (long, None),
        };
        let needs_value = command
            .get_arguments()
            .find(|a| a.get_long() == Some(name))
            .is_some_and(|a| a.get_num_args().is_some_and(|n| n.min_values() > 0));
        match (inline_value, needs_value) {
            (None, true) => match args.next() {
                Some(value) => {
                    let mut joined = std::ffi::OsString::from(format!("--{name}="));
                    joined.push(value);
                    out.push(joined);
                }
                None => out.push(format!("--{name}").into()),
            },
            _ => out.push(format!("--{long}").into()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::Command;

    fn go_style(argv: &[&str]) -> Vec<String> {
        etcd_style_args(argv.iter().map(Into::into)).into_iter().map(|a| a.into_string().unwrap()).collect()
    }

    #[test]
    fn accepts_go_style_single_dash_flags() {
        assert_eq!(
            go_style(&["keyward", "serve", "-name", "n1", "--data-dir=d", "-h"]),
            ["keyward", "serve", "--name=n1", "--data-dir=d", "-h"]
        );
        assert_eq!(
            go_style(&["keyward", "serve", "-client-cert-auth", "-log-level=warn", "-max-txn-ops", "64"]),
            ["keyward", "serve", "--client-cert-auth", "--log-level=warn", "--max-txn-ops=64"]
        );
    }

    /// A flag's value is never rewritten, also when it looks like a flag: `-initial-cluster-token -abc`
    /// is the token `-abc`, as etcd reads it.
    #[test]
    fn flag_values_that_start_with_a_dash_are_values() {
        let args =
            go_style(&["keyward", "serve", "-initial-cluster-token", "-abc", "-name", "-n1", "--data-dir", "-d"]);
        assert_eq!(args, ["keyward", "serve", "--initial-cluster-token=-abc", "--name=-n1", "--data-dir=-d"]);
        let cli = Cli::try_parse_from(args).unwrap();
        let Command::Serve(serve) = cli.command else { panic!("not serve") };
        assert_eq!(
            (serve.initial_cluster_token.as_str(), serve.name.as_str(), serve.data_dir.to_str()),
            ("-abc", "-n1", Some("-d"))
        );
        // A boolean flag takes no separate value: what follows it is the next flag.
        assert_eq!(
            go_style(&["keyward", "serve", "-client-cert-auth", "-name", "n"]),
            ["keyward", "serve", "--client-cert-auth", "--name=n"]
        );
        // After `--` nothing is a flag.
        assert_eq!(go_style(&["keyward", "serve", "--", "-name"]), ["keyward", "serve", "--", "-name"]);
        // A flag at the end with no value is left for clap to refuse.
        assert!(Cli::try_parse_from(go_style(&["keyward", "serve", "-name"])).is_err());
    }
}
