//! `/metrics` against etcd 3.4's: after the same traffic on both, every family issue 14 lists is
//! exposed by keyward with etcd's type and label names, proposals count requests (10 puts move them by
//! 10 on both servers), the gRPC counters count calls by code; how many of etcd's families keyward
//! has is printed. And the Grafana dashboard in `deploy/` uses only metrics keyward exposes.

use std::collections::{BTreeMap, BTreeSet};

use crate::common;
use crate::common::Server;

/// One scrape: family name → (type, label names of its samples, without a histogram's `le`).
type Families = BTreeMap<String, (String, BTreeSet<String>)>;

/// `GET /metrics` over HTTP/1.0, so that no server answers in chunks.
fn get_metrics(endpoint: &str) -> String {
    use std::io::{Read, Write};
    let mut tcp = std::net::TcpStream::connect(endpoint).expect("connect");
    tcp.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
    write!(tcp, "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut response = String::new();
    tcp.read_to_string(&mut response).expect("read response");
    let (head, body) = response.split_once("\r\n\r\n").expect("a response");
    assert!(head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"), "{endpoint}: {head}");
    assert!(!head.to_ascii_lowercase().contains("transfer-encoding: chunked"), "{head}");
    body.to_string()
}

fn scrape(server: &Server) -> (String, Families) {
    let text = get_metrics(&server.endpoint());
    let mut families = Families::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("# TYPE name type");
            families.insert(name.to_string(), (kind.to_string(), BTreeSet::new()));
        }
    }
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let name_end = line.find(['{', ' ']).expect("sample");
        let sample = &line[..name_end];
        let family = families
            .keys()
            .find(|f| {
                sample == f.as_str()
                    || ["_bucket", "_sum", "_count"].iter().any(|s| sample.strip_suffix(s) == Some(f.as_str()))
            })
            .cloned()
            .unwrap_or_else(|| panic!("sample {sample} has no # TYPE"));
        let labels = labels_of(line);
        families.get_mut(&family).unwrap().1.extend(labels.into_keys().filter(|l| l != "le"));
    }
    (text, families)
}

/// The labels of one sample line.
fn labels_of(line: &str) -> BTreeMap<String, String> {
    let Some(open) = line.find('{') else { return BTreeMap::new() };
    let close = line.rfind('}').expect("closing brace");
    line[open + 1..close]
        .split("\",")
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once("=\"").expect("label=\"value\"");
            (k.to_string(), v.trim_end_matches('"').to_string())
        })
        .collect()
}

/// The value of the sample of `family` whose labels include every one of `labels`.
fn value(text: &str, family: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(family) && matches!(l.as_bytes().get(family.len()), Some(b'{' | b' ')))
        .find(|l| {
            let have = labels_of(l);
            labels.iter().all(|(k, v)| have.get(*k).map(String::as_str) == Some(*v))
        })
        .and_then(|l| l.rsplit(' ').next())
        .unwrap_or_else(|| panic!("no {family}{labels:?} in:\n{text}"))
        .parse()
        .unwrap()
}

/// Every family issue 14 names, with the type etcd gives it.
const REQUIRED: &[(&str, &str)] = &[
    ("grpc_server_started_total", "counter"),
    ("grpc_server_handled_total", "counter"),
    ("grpc_server_msg_received_total", "counter"),
    ("grpc_server_msg_sent_total", "counter"),
    ("etcd_disk_wal_fsync_duration_seconds", "histogram"),
    ("etcd_disk_backend_commit_duration_seconds", "histogram"),
    ("etcd_disk_defrag_inflight", "gauge"),
    ("etcd_mvcc_db_total_size_in_bytes", "gauge"),
    ("etcd_mvcc_db_total_size_in_use_in_bytes", "gauge"),
    ("etcd_server_has_leader", "gauge"),
    ("etcd_server_is_leader", "gauge"),
    ("etcd_server_leader_changes_seen_total", "counter"),
    ("etcd_server_proposals_committed_total", "gauge"),
    ("etcd_server_proposals_applied_total", "gauge"),
    ("etcd_server_proposals_pending", "gauge"),
    ("etcd_server_proposals_failed_total", "counter"),
    ("etcd_server_id", "gauge"),
    ("etcd_server_version", "gauge"),
    ("etcd_mvcc_put_total", "counter"),
    ("etcd_mvcc_range_total", "counter"),
    ("etcd_mvcc_txn_total", "counter"),
    ("etcd_mvcc_delete_total", "counter"),
    ("process_cpu_seconds_total", "counter"),
    ("process_resident_memory_bytes", "gauge"),
    ("process_open_fds", "gauge"),
    ("process_max_fds", "gauge"),
    ("process_start_time_seconds", "gauge"),
    ("process_virtual_memory_bytes", "gauge"),
];

/// The same traffic on both servers: puts, a read, a refused compaction, a short watch, a status.
async fn traffic(server: &Server) {
    let mut c = server.client().await;
    c.put("m/a", "1", None).await.expect("put");
    c.get("m/a", None).await.expect("get");
    assert!(c.compact(1_000_000, None).await.is_err(), "a compaction beyond the revision is refused");
    let mut watch = c.watch("m/", None).await.expect("watch");
    watch.message().await.expect("watch created");
    drop(watch);
    c.status().await.expect("status");
}

#[tokio::test]
async fn metrics_have_etcds_names_types_and_labels_and_proposals_count_requests() {
    let (etcd, keyward) = common::start_pair().await;
    traffic(&etcd).await;
    traffic(&keyward).await;
    let (_, etcd_families) = scrape(&etcd);
    let (before, keyward_families) = scrape(&keyward);

    for &(name, kind) in REQUIRED {
        let (got_kind, got_labels) =
            keyward_families.get(name).unwrap_or_else(|| panic!("keyward has no {name}:\n{before}"));
        assert_eq!(got_kind, kind, "{name}'s type");
        let (etcd_kind, etcd_labels) = etcd_families.get(name).unwrap_or_else(|| panic!("etcd has no {name}"));
        assert_eq!((got_kind, got_labels), (etcd_kind, etcd_labels), "{name}: type and label names as etcd's");
    }
    // etcd 3.4 exposes the handling-time histogram only with `--metrics extensive`; its labels are
    // go-grpc-prometheus' (those of grpc_server_started_total).
    let (kind, labels) = &keyward_families["grpc_server_handling_seconds"];
    assert_eq!(kind, "histogram");
    assert_eq!(labels, &etcd_families["grpc_server_started_total"].1);

    // Codes as grpc-go names them, per method.
    let put = [("grpc_method", "Put"), ("grpc_service", "etcdserverpb.KV"), ("grpc_type", "unary")];
    let compact = [("grpc_method", "Compact"), ("grpc_service", "etcdserverpb.KV"), ("grpc_code", "OutOfRange")];
    let watch = [("grpc_method", "Watch"), ("grpc_type", "bidi_stream")];
    for (server, text) in [(&etcd, scrape(&etcd).0), (&keyward, before.clone())] {
        let label = server.kind.label();
        assert_eq!(value(&text, "grpc_server_handled_total", &compact), 1.0, "{label}: refused compaction");
        assert_eq!(value(&text, "grpc_server_started_total", &watch), 1.0, "{label}: watch started");
        assert_eq!(value(&text, "grpc_server_msg_received_total", &watch), 1.0, "{label}: watch create request");
        assert!(value(&text, "grpc_server_msg_sent_total", &watch) >= 1.0, "{label}: watch created response");
        assert!(value(&text, "etcd_server_leader_changes_seen_total", &[]) >= 1.0, "{label}: leader elected");
        assert_eq!(value(&text, "etcd_server_has_leader", &[]), 1.0, "{label}");
    }

    // 10 puts, one request each: proposals and gRPC counters move by exactly 10 on both servers.
    for server in [&etcd, &keyward] {
        let label = server.kind.label();
        let (before, _) = scrape(server);
        let mut c = server.client().await;
        for i in 0..10 {
            c.put(format!("m/{i}"), "v", None).await.expect("put");
        }
        let (after, _) = scrape(server);
        let moved =
            |family: &str, labels: &[(&str, &str)]| value(&after, family, labels) - value(&before, family, labels);
        assert_eq!(moved("etcd_server_proposals_committed_total", &[]), 10.0, "{label}: committed");
        assert_eq!(moved("etcd_server_proposals_applied_total", &[]), 10.0, "{label}: applied");
        assert_eq!(value(&after, "etcd_server_proposals_pending", &[]), 0.0, "{label}: pending");
        assert_eq!(moved("grpc_server_started_total", &put), 10.0, "{label}: Put started");
        assert_eq!(moved("etcd_mvcc_put_total", &[]), 10.0, "{label}: mvcc puts");
        assert_eq!(moved("grpc_server_msg_received_total", &put), 10.0, "{label}: Put requests");
        assert_eq!(moved("grpc_server_msg_sent_total", &put), 10.0, "{label}: Put responses");
        let put_ok = [put[0], put[1], put[2], ("grpc_code", "OK")];
        assert_eq!(moved("grpc_server_handled_total", &put_ok), 10.0, "{label}: Put handled OK");
        assert!(moved("etcd_disk_wal_fsync_duration_seconds_count", &[]) >= 1.0, "{label}: log fsyncs");
        if server.kind == common::Kind::Keyward {
            // etcd commits its backend every 100 ms, not per apply: only keyward's is certain to move.
            assert!(moved("etcd_disk_backend_commit_duration_seconds_count", &[]) >= 1.0, "{label}: backend commits");
            assert_eq!(moved("grpc_server_handling_seconds_count", &put), 10.0, "{label}: Put timed");
        }
    }

    // The mvcc counters move alike on both: a get, a delete, a txn with a compare and a put.
    let mut deltas = Vec::new();
    for server in [&etcd, &keyward] {
        let (before, _) = scrape(server);
        let mut c = server.client().await;
        c.get("m/1", None).await.expect("get");
        c.delete("m/2", None).await.expect("delete");
        let txn = etcd_client::Txn::new()
            .when([etcd_client::Compare::value("m/1", etcd_client::CompareOp::Equal, "v")])
            .and_then([etcd_client::TxnOp::put("m/3", "w", None)]);
        assert!(c.txn(txn).await.expect("txn").succeeded());
        let (after, _) = scrape(server);
        let moved: Vec<f64> =
            ["etcd_mvcc_range_total", "etcd_mvcc_put_total", "etcd_mvcc_delete_total", "etcd_mvcc_txn_total"]
                .iter()
                .map(|family| value(&after, family, &[]) - value(&before, family, &[]))
                .collect();
        deltas.push(moved);
    }
    assert_eq!(deltas[0], deltas[1], "range, put, delete, txn counts (left etcd, right keyward)");

    let etcd_names: BTreeSet<&String> = etcd_families.keys().collect();
    let keyward_names: BTreeSet<&String> = keyward_families.keys().collect();
    let shared: Vec<_> = etcd_names.intersection(&keyward_names).collect();
    let missing: Vec<_> = etcd_names.difference(&keyward_names).collect();
    let go_runtime = missing.iter().filter(|n| n.starts_with("go_")).count();
    println!(
        "keyward exposes {} of etcd's {} metric families ({} of etcd's are Go runtime's go_*); keyward has {} \
         families in all.\nmissing: {missing:?}",
        shared.len(),
        etcd_names.len(),
        go_runtime,
        keyward_names.len()
    );
}

/// Every metric a PromQL expression of the dashboard names is one keyward exposes.
#[test]
fn the_grafana_dashboard_uses_only_metrics_keyward_exposes() {
    let server = Server::start(common::Kind::Keyward);
    // An auth denial, so that keyward_auth_denials_total (labelled by operation and reason) exists.
    for args in [&["user", "add", "root:rootpw"][..], &["user", "grant-role", "root", "root"], &["auth", "enable"]] {
        assert!(server.etcdctl(args).success(), "{args:?}");
    }
    assert!(!server.etcdctl(&["put", "k", "v"]).success(), "anonymous put with auth on");
    let (_, families) = scrape(&server);
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/grafana/keyward-dashboard.json");
    let dashboard: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut exprs = Vec::new();
    collect_exprs(&dashboard, &mut exprs);
    assert!(exprs.len() >= 10, "the dashboard has its panels: {exprs:?}");
    let mut used = BTreeSet::new();
    for expr in &exprs {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "no metric in {expr:?}");
        used.extend(names);
    }
    let exposed = |name: &str| {
        families.contains_key(name)
            || ["_bucket", "_sum", "_count"]
                .iter()
                .any(|s| name.strip_suffix(s).is_some_and(|f| families.get(f).is_some_and(|(k, _)| k == "histogram")))
    };
    let unknown: Vec<_> = used.iter().filter(|n| !exposed(n)).collect();
    assert!(unknown.is_empty(), "the dashboard uses metrics keyward does not expose: {unknown:?}");
    println!("the dashboard's {} queries use {} metrics, all exposed", exprs.len(), used.len());
}

#[test]
fn metric_names_of_promql() {
    let names = |e: &str| metric_names(e).into_iter().collect::<Vec<_>>();
    assert_eq!(
        names("sum by (grpc_method, grpc_code) (rate(grpc_server_handled_total{grpc_code!=\"OK\"}[$__rate_interval]))"),
        ["grpc_server_handled_total"]
    );
    assert_eq!(
        names(
            "histogram_quantile(0.99, sum by (instance, le) (rate(etcd_disk_wal_fsync_duration_seconds_bucket[5m])))"
        ),
        ["etcd_disk_wal_fsync_duration_seconds_bucket"]
    );
    assert_eq!(names("process_open_fds / process_max_fds"), ["process_max_fds", "process_open_fds"]);
}

fn collect_exprs(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr", serde_json::Value::String(expr)) => out.push(expr.clone()),
                    _ => collect_exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| collect_exprs(v, out)),
        _ => {}
    }
}

/// The metric names in a PromQL expression: identifiers that are not functions, keywords, label
/// names or label values.
fn metric_names(expr: &str) -> BTreeSet<String> {
    const NOT_METRICS: &[&str] = &["sum", "max", "min", "avg", "count", "topk", "and", "or", "unless"];
    let mut names = BTreeSet::new();
    let bytes = expr.as_bytes();
    let (mut i, mut in_braces, mut in_string) = (0, false, false);
    while i < bytes.len() {
        let c = bytes[i] as char;
        match c {
            '"' => in_string = !in_string,
            '{' if !in_string => in_braces = true,
            '}' if !in_string => in_braces = false,
            '[' if !in_string => {
                // a range such as [5m]
                while i < bytes.len() && bytes[i] != b']' {
                    i += 1;
                }
            }
            c if !in_string && !in_braces && (c.is_ascii_alphabetic() || c == '_') => {
                let start = i;
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_' || bytes[i] == b':') {
                    i += 1;
                }
                let word = &expr[start..i];
                if ["by", "without", "on", "ignoring", "group_left", "group_right"].contains(&word) {
                    // its label list: (a, b)
                    let open = i + (expr[i..].len() - expr[i..].trim_start().len());
                    if bytes.get(open) == Some(&b'(') {
                        i = open + expr[open..].find(')').map_or(expr.len() - open, |at| at + 1);
                    }
                    continue;
                }
                if !NOT_METRICS.contains(&word) && !expr[i..].trim_start().starts_with('(') {
                    names.insert(word.to_string());
                }
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    names
}
