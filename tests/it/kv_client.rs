//! etcd KV semantics through a real gRPC client (the `etcd-client` crate) against `keyward serve`.
//!
//! Every test starts its own fresh single-member server, so revisions are predictable: an empty store is
//! at revision 1 and the first write gets revision 2. Each test runs against keyward; with
//! `KEYWARD_HARNESS_SELFTEST=1` the same tests run against a real etcd 3.4 instead, which is how the
//! expectations were checked.

use crate::common::etcd_errors::{
    COMPACTED, DUPLICATE_KEY, EMPTY_KEY, FUTURE_REV, KEY_NOT_FOUND, LEASE_NOT_FOUND, LEASE_PROVIDED, TOO_LARGE,
    TOO_MANY_OPS, VALUE_PROVIDED,
};
use crate::common::{assert_status, current_revision, Kind, Server};
use etcd_client::{
    Client, CompactionOptions, Compare, CompareOp, DeleteOptions, GetOptions, GetResponse, KeyValue, PutOptions,
    SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use tonic::Code;

// ---------------------------------------------------------------------------
// helpers
// ---------------------------------------------------------------------------

/// A running server and a client connected to it (the server is killed on drop).
struct Fixture {
    server: Server,
    c: Client,
}

/// keyward, or etcd 3.4 under `KEYWARD_HARNESS_SELFTEST=1`.
async fn start() -> Fixture {
    start_with(&[]).await
}

async fn start_with(args: &[&str]) -> Fixture {
    let server = Server::start_with(Kind::under_test(), args);
    let c = server.client().await;
    Fixture { server, c }
}

/// Put and return the header revision.
async fn put(c: &mut Client, key: &str, value: &str) -> i64 {
    c.put(key, value, None)
        .await
        .unwrap_or_else(|e| panic!("put {key}={value}: {e}"))
        .header()
        .expect("header")
        .revision()
}

async fn get(c: &mut Client, key: &str, opts: Option<GetOptions>) -> GetResponse {
    c.get(key, opts).await.unwrap_or_else(|e| panic!("get {key}: {e}"))
}

/// The single kv at `key` (latest revision), if any.
async fn get_kv(c: &mut Client, key: &str) -> Option<KeyValue> {
    let resp = get(c, key, None).await;
    assert!(resp.kvs().len() <= 1, "single-key get returned {:?}", resp);
    resp.kvs().first().cloned()
}

fn s(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn keys(kvs: &[KeyValue]) -> Vec<String> {
    kvs.iter().map(|kv| s(kv.key())).collect()
}

fn header_rev(resp: &GetResponse) -> i64 {
    resp.header().expect("header").revision()
}

/// (key, value, create_revision, mod_revision, version, lease) of one kv.
fn meta(kv: &KeyValue) -> (String, String, i64, i64, i64, i64) {
    (s(kv.key()), s(kv.value()), kv.create_revision(), kv.mod_revision(), kv.version(), kv.lease())
}

fn m(key: &str, value: &str, create: i64, modr: i64, version: i64) -> (String, String, i64, i64, i64, i64) {
    (key.to_string(), value.to_string(), create, modr, version, 0)
}

/// Run a txn that has only `compare` and no operations; return whether it succeeded.
async fn holds(c: &mut Client, compares: Vec<Compare>) -> bool {
    c.txn(Txn::new().when(compares)).await.expect("compare-only txn").succeeded()
}

fn txn_rev(resp: &TxnResponse) -> i64 {
    resp.header().expect("txn header").revision()
}

fn as_get(resp: &TxnOpResponse) -> &GetResponse {
    match resp {
        TxnOpResponse::Get(g) => g,
        other => panic!("expected a range response, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------
// put / get, revisions and versions
// ---------------------------------------------------------------------------

#[tokio::test]
async fn revisions_start_at_1_and_first_put_gets_revision_2() {
    let Fixture { server: _s, mut c } = start().await;
    let empty = get(&mut c, "a", None).await;
    assert_eq!(header_rev(&empty), 1, "empty store is at revision 1");
    assert!(empty.kvs().is_empty());
    assert_eq!(empty.count(), 0);
    assert!(!empty.more());

    let resp = c.put("a", "1", None).await.unwrap();
    assert_eq!(resp.header().unwrap().revision(), 2);
    assert!(resp.prev_key().is_none(), "no prev_kv unless asked");
    let kv = get_kv(&mut c, "a").await.expect("a exists");
    assert_eq!(meta(&kv), m("a", "1", 2, 2, 1));
    assert_eq!(put(&mut c, "b", "x").await, 3, "each put is one revision");
    assert_eq!(current_revision(&mut c).await, 3);
}

#[tokio::test]
async fn create_mod_revision_and_version_across_update_delete_recreate() {
    let Fixture { server: _s, mut c } = start().await;
    assert_eq!(put(&mut c, "k", "v1").await, 2);
    assert_eq!(put(&mut c, "other", "o").await, 3);
    assert_eq!(put(&mut c, "k", "v2").await, 4);
    assert_eq!(meta(&get_kv(&mut c, "k").await.unwrap()), m("k", "v2", 2, 4, 2));
    assert_eq!(put(&mut c, "k", "v3").await, 5);
    assert_eq!(meta(&get_kv(&mut c, "k").await.unwrap()), m("k", "v3", 2, 5, 3));
    // an update with the same value is still a new revision and version
    assert_eq!(put(&mut c, "k", "v3").await, 6);
    assert_eq!(meta(&get_kv(&mut c, "k").await.unwrap()), m("k", "v3", 2, 6, 4));

    let del = c.delete("k", None).await.unwrap();
    assert_eq!(del.deleted(), 1);
    assert_eq!(del.header().unwrap().revision(), 7);
    let gone = get(&mut c, "k", None).await;
    assert!(gone.kvs().is_empty());
    assert_eq!(gone.count(), 0);
    assert_eq!(header_rev(&gone), 7);

    // re-create: version restarts at 1, create_revision is the new revision
    assert_eq!(put(&mut c, "k", "v4").await, 8);
    assert_eq!(meta(&get_kv(&mut c, "k").await.unwrap()), m("k", "v4", 8, 8, 1));
    assert_eq!(put(&mut c, "k", "v5").await, 9);
    assert_eq!(meta(&get_kv(&mut c, "k").await.unwrap()), m("k", "v5", 8, 9, 2));

    // the history is still readable
    let at = |r: i64| Some(GetOptions::new().with_revision(r));
    let h = get(&mut c, "k", at(5)).await;
    assert_eq!(meta(&h.kvs()[0]), m("k", "v3", 2, 5, 3));
    assert_eq!(header_rev(&h), 9, "header revision is the current one, not the requested one");
    assert!(get(&mut c, "k", at(7)).await.kvs().is_empty(), "deleted at 7");
    assert_eq!(meta(&get(&mut c, "k", at(8)).await.kvs()[0]), m("k", "v4", 8, 8, 1));
    assert!(get(&mut c, "k", at(1)).await.kvs().is_empty(), "not yet created at 1");
    // the untouched key keeps its revisions
    assert_eq!(meta(&get_kv(&mut c, "other").await.unwrap()), m("other", "o", 3, 3, 1));
}

// ---------------------------------------------------------------------------
// range
// ---------------------------------------------------------------------------

/// a b c foo foo/1 foo/2 fop z, put in this order (revisions 2..=9).
async fn put_range_dataset(c: &mut Client) {
    for k in ["a", "b", "c", "foo", "foo/1", "foo/2", "fop", "z"] {
        put(c, k, &format!("v-{k}")).await;
    }
}

#[tokio::test]
async fn range_single_key_key_end_prefix_and_from_key() {
    let Fixture { server: _s, mut c } = start().await;
    put_range_dataset(&mut c).await;

    let one = get(&mut c, "b", None).await;
    assert_eq!(keys(one.kvs()), ["b"]);
    assert_eq!(s(one.kvs()[0].value()), "v-b");
    assert_eq!(one.count(), 1);
    assert!(get(&mut c, "fo", None).await.kvs().is_empty(), "single key is exact, not a prefix");

    // [key, end): end is exclusive
    let r = get(&mut c, "a", Some(GetOptions::new().with_range("c"))).await;
    assert_eq!(keys(r.kvs()), ["a", "b"]);
    assert_eq!(r.count(), 2);
    let r = get(&mut c, "b", Some(GetOptions::new().with_range("foo0"))).await;
    assert_eq!(keys(r.kvs()), ["b", "c", "foo", "foo/1", "foo/2"]);
    // an end before the key selects nothing
    let r = get(&mut c, "c", Some(GetOptions::new().with_range("a"))).await;
    assert!(r.kvs().is_empty());
    assert_eq!(r.count(), 0);

    // prefix
    let r = get(&mut c, "foo", Some(GetOptions::new().with_prefix())).await;
    assert_eq!(keys(r.kvs()), ["foo", "foo/1", "foo/2"]);
    assert_eq!(r.count(), 3);
    let r = get(&mut c, "foo/", Some(GetOptions::new().with_prefix())).await;
    assert_eq!(keys(r.kvs()), ["foo/1", "foo/2"]);
    let r = get(&mut c, "nothing", Some(GetOptions::new().with_prefix())).await;
    assert!(r.kvs().is_empty());

    // from key (range_end "\0"): every key >= key
    let r = get(&mut c, "fop", Some(GetOptions::new().with_from_key())).await;
    assert_eq!(keys(r.kvs()), ["fop", "z"]);
    let r = get(&mut c, "d", Some(GetOptions::new().with_from_key())).await;
    assert_eq!(keys(r.kvs()), ["foo", "foo/1", "foo/2", "fop", "z"]);
    // all keys (key "\0", range_end "\0")
    let r = get(&mut c, "", Some(GetOptions::new().with_all_keys())).await;
    assert_eq!(keys(r.kvs()), ["a", "b", "c", "foo", "foo/1", "foo/2", "fop", "z"]);
    assert_eq!(r.count(), 8);
    assert_eq!(header_rev(&r), 9);
}

#[tokio::test]
async fn range_limit_sets_more_and_count_is_the_total() {
    let Fixture { server: _s, mut c } = start().await;
    put_range_dataset(&mut c).await;

    let r = get(&mut c, "foo", Some(GetOptions::new().with_prefix().with_limit(2))).await;
    assert_eq!(keys(r.kvs()), ["foo", "foo/1"]);
    assert!(r.more());
    assert_eq!(r.count(), 3, "count is the total in the range, not the number returned");

    let r = get(&mut c, "foo", Some(GetOptions::new().with_prefix().with_limit(3))).await;
    assert_eq!(keys(r.kvs()), ["foo", "foo/1", "foo/2"]);
    assert!(!r.more(), "limit == number of keys: nothing more");
    assert_eq!(r.count(), 3);

    let r = get(&mut c, "foo", Some(GetOptions::new().with_prefix().with_limit(100))).await;
    assert_eq!(r.kvs().len(), 3);
    assert!(!r.more());

    let r = get(&mut c, "", Some(GetOptions::new().with_all_keys().with_limit(1))).await;
    assert_eq!(keys(r.kvs()), ["a"]);
    assert!(r.more());
    assert_eq!(r.count(), 8);

    // limit 0 means no limit
    let r = get(&mut c, "", Some(GetOptions::new().with_all_keys().with_limit(0))).await;
    assert_eq!(r.kvs().len(), 8);
    assert!(!r.more());

    // a limit on a single-key get
    let r = get(&mut c, "a", Some(GetOptions::new().with_limit(1))).await;
    assert_eq!(keys(r.kvs()), ["a"]);
    assert!(!r.more());
    assert_eq!(r.count(), 1);
}

#[tokio::test]
async fn range_at_historical_revision() {
    let Fixture { server: _s, mut c } = start().await;
    assert_eq!(put(&mut c, "a", "1").await, 2);
    assert_eq!(put(&mut c, "a", "2").await, 3);
    assert_eq!(put(&mut c, "b", "1").await, 4);
    assert_eq!(c.delete("a", None).await.unwrap().header().unwrap().revision(), 5);
    assert_eq!(put(&mut c, "c", "1").await, 6);

    let all_at = |r: i64| Some(GetOptions::new().with_all_keys().with_revision(r));
    let at = |r: i64| Some(GetOptions::new().with_revision(r));
    assert!(get(&mut c, "", all_at(1)).await.kvs().is_empty());
    let r = get(&mut c, "", all_at(2)).await;
    assert_eq!(r.kvs().iter().map(meta).collect::<Vec<_>>(), [m("a", "1", 2, 2, 1)]);
    assert_eq!(r.count(), 1);
    assert_eq!(header_rev(&r), 6, "header is the current revision");
    let r = get(&mut c, "", all_at(3)).await;
    assert_eq!(r.kvs().iter().map(meta).collect::<Vec<_>>(), [m("a", "2", 2, 3, 2)]);
    let r = get(&mut c, "", all_at(4)).await;
    assert_eq!(r.kvs().iter().map(meta).collect::<Vec<_>>(), [m("a", "2", 2, 3, 2), m("b", "1", 4, 4, 1)]);
    assert_eq!(r.count(), 2);
    let r = get(&mut c, "", all_at(5)).await;
    assert_eq!(keys(r.kvs()), ["b"]);
    assert_eq!(r.count(), 1);
    let r = get(&mut c, "", all_at(6)).await;
    assert_eq!(keys(r.kvs()), ["b", "c"]);
    assert_eq!(s(get(&mut c, "a", at(3)).await.kvs()[0].value()), "2");
    // limit and more work at a historical revision too
    let r = get(&mut c, "", Some(GetOptions::new().with_all_keys().with_revision(4).with_limit(1))).await;
    assert_eq!(keys(r.kvs()), ["a"]);
    assert!(r.more());
    assert_eq!(r.count(), 2);
    // revision 0 and negative revisions mean "latest"
    assert_eq!(keys(get(&mut c, "", all_at(0)).await.kvs()), ["b", "c"]);
    assert_eq!(keys(get(&mut c, "", all_at(-1)).await.kvs()), ["b", "c"]);
}

/// Three keys whose orders by key, version, create, mod and value are five different permutations:
///
/// | key | value | create | mod | version |
/// |-----|-------|--------|-----|---------|
/// | a   | "3"   | 3      | 7   | 2       |
/// | b   | "2"   | 4      | 4   | 1       |
/// | c   | "1"   | 2      | 6   | 3       |
async fn put_sort_dataset(c: &mut Client) {
    assert_eq!(put(c, "s/c", "x").await, 2);
    assert_eq!(put(c, "s/a", "x").await, 3);
    assert_eq!(put(c, "s/b", "2").await, 4);
    assert_eq!(put(c, "s/c", "x").await, 5);
    assert_eq!(put(c, "s/c", "1").await, 6);
    assert_eq!(put(c, "s/a", "3").await, 7);
}

#[tokio::test]
async fn range_sort_by_every_target_and_order() {
    let Fixture { server: _s, mut c } = start().await;
    put_sort_dataset(&mut c).await;
    let cases = [
        (SortTarget::Key, ["s/a", "s/b", "s/c"]),
        (SortTarget::Version, ["s/b", "s/a", "s/c"]),
        (SortTarget::Create, ["s/c", "s/a", "s/b"]),
        (SortTarget::Mod, ["s/b", "s/c", "s/a"]),
        (SortTarget::Value, ["s/c", "s/b", "s/a"]),
    ];
    for (target, ascending) in cases {
        let sorted = |order| Some(GetOptions::new().with_prefix().with_sort(target, order));
        let r = get(&mut c, "s/", sorted(SortOrder::Ascend)).await;
        assert_eq!(keys(r.kvs()), ascending, "{target:?} ascending");
        assert_eq!(r.count(), 3);
        let mut descending = ascending.to_vec();
        descending.reverse();
        let r = get(&mut c, "s/", sorted(SortOrder::Descend)).await;
        assert_eq!(keys(r.kvs()), descending, "{target:?} descending");
        // order NONE: by key for target KEY, ascending by the target for every other target
        let r = get(&mut c, "s/", sorted(SortOrder::None)).await;
        assert_eq!(keys(r.kvs()), ascending, "{target:?} with order NONE");

        // sorting happens before the limit: the first of the whole sorted range is returned
        let limited = Some(GetOptions::new().with_prefix().with_sort(target, SortOrder::Descend).with_limit(2));
        let r = get(&mut c, "s/", limited).await;
        assert_eq!(keys(r.kvs()), descending[..2], "{target:?} descending, limit 2");
        assert!(r.more(), "{target:?} descending, limit 2: more");
        assert_eq!(r.count(), 3);
    }
    // keys_only strips the values after sorting by them
    let r = get(
        &mut c,
        "s/",
        Some(GetOptions::new().with_prefix().with_keys_only().with_sort(SortTarget::Value, SortOrder::Ascend)),
    )
    .await;
    assert_eq!(keys(r.kvs()), ["s/c", "s/b", "s/a"], "keys_only sorted by value");
    assert!(r.kvs().iter().all(|kv| kv.value().is_empty()));
}

#[tokio::test]
async fn range_keys_only_and_count_only() {
    let Fixture { server: _s, mut c } = start().await;
    put_sort_dataset(&mut c).await;

    let r = get(&mut c, "s/", Some(GetOptions::new().with_prefix().with_keys_only())).await;
    assert_eq!(
        r.kvs().iter().map(meta).collect::<Vec<_>>(),
        [m("s/a", "", 3, 7, 2), m("s/b", "", 4, 4, 1), m("s/c", "", 2, 6, 3)],
        "keys_only: no values, but all revisions and versions"
    );
    assert_eq!(r.count(), 3);

    let r = get(&mut c, "s/", Some(GetOptions::new().with_prefix().with_count_only())).await;
    assert!(r.kvs().is_empty(), "count_only returns no kvs");
    assert_eq!(r.count(), 3);
    assert!(!r.more());
    assert_eq!(header_rev(&r), 7);

    let r = get(&mut c, "s/", Some(GetOptions::new().with_prefix().with_count_only().with_limit(1))).await;
    assert!(r.kvs().is_empty());
    assert_eq!(r.count(), 3, "count_only ignores the limit for the count");

    let r = get(&mut c, "s/b", Some(GetOptions::new().with_count_only())).await;
    assert_eq!(r.count(), 1);
    let r = get(&mut c, "s/x", Some(GetOptions::new().with_count_only())).await;
    assert_eq!(r.count(), 0);
    // at a historical revision
    let r = get(&mut c, "s/", Some(GetOptions::new().with_prefix().with_count_only().with_revision(3))).await;
    assert_eq!(r.count(), 2);
}

#[tokio::test]
async fn range_min_max_mod_and_create_revision_filters() {
    let Fixture { server: _s, mut c } = start().await;
    put_sort_dataset(&mut c).await;
    let filtered = |o: GetOptions| Some(o.with_prefix());
    // mods: a 7, b 4, c 6; creates: a 3, b 4, c 2
    let cases: Vec<(GetOptions, Vec<&str>)> = vec![
        (GetOptions::new().with_min_mod_revision(5), vec!["s/a", "s/c"]),
        (GetOptions::new().with_min_mod_revision(7), vec!["s/a"]),
        (GetOptions::new().with_min_mod_revision(8), vec![]),
        (GetOptions::new().with_max_mod_revision(6), vec!["s/b", "s/c"]),
        (GetOptions::new().with_max_mod_revision(4), vec!["s/b"]),
        (GetOptions::new().with_max_mod_revision(3), vec![]),
        (GetOptions::new().with_min_create_revision(3), vec!["s/a", "s/b"]),
        (GetOptions::new().with_max_create_revision(3), vec!["s/a", "s/c"]),
        (GetOptions::new().with_max_create_revision(2), vec!["s/c"]),
        (GetOptions::new().with_min_mod_revision(5).with_max_mod_revision(6), vec!["s/c"]),
        (GetOptions::new().with_min_create_revision(3).with_max_create_revision(3), vec!["s/a"]),
        (GetOptions::new().with_min_mod_revision(5).with_min_create_revision(3), vec!["s/a"]),
    ];
    for (opts, want) in cases {
        let desc = format!("{opts:?}");
        let r = get(&mut c, "s/", filtered(opts)).await;
        assert_eq!(keys(r.kvs()), want, "filter {desc}");
        assert_eq!(r.count(), 3, "count is taken before the filters: {desc}");
    }

    // with a limit, the filters apply first and the limit after them
    let r = get(&mut c, "s/", filtered(GetOptions::new().with_min_mod_revision(5).with_limit(1))).await;
    assert_eq!(keys(r.kvs()), ["s/a"]);
    assert!(r.more());
    let r = get(&mut c, "s/", filtered(GetOptions::new().with_max_mod_revision(4).with_limit(1))).await;
    assert_eq!(keys(r.kvs()), ["s/b"], "the filter is not applied to the first `limit` keys only");
    assert!(!r.more());
    // and combined with sorting
    let r = get(
        &mut c,
        "s/",
        filtered(GetOptions::new().with_min_mod_revision(5).with_sort(SortTarget::Mod, SortOrder::Ascend)),
    )
    .await;
    assert_eq!(keys(r.kvs()), ["s/c", "s/a"]);
    // at a historical revision: at 5, mods are a 3, b 4, c 5
    let r = get(&mut c, "s/", filtered(GetOptions::new().with_revision(5).with_min_mod_revision(4))).await;
    assert_eq!(keys(r.kvs()), ["s/b", "s/c"]);
}

#[tokio::test]
async fn range_serializable_reads_the_latest_applied_data() {
    let Fixture { server: _s, mut c } = start().await;
    put_range_dataset(&mut c).await;
    assert_eq!(put(&mut c, "b", "new").await, 10);
    let r = get(&mut c, "b", Some(GetOptions::new().with_serializable())).await;
    assert_eq!(meta(&r.kvs()[0]), m("b", "new", 3, 10, 2));
    assert_eq!(header_rev(&r), 10);
    let r = get(&mut c, "foo", Some(GetOptions::new().with_prefix().with_serializable().with_limit(2))).await;
    assert_eq!(keys(r.kvs()), ["foo", "foo/1"]);
    assert!(r.more());
    assert_eq!(r.count(), 3);
    let r = get(&mut c, "a", Some(GetOptions::new().with_serializable().with_revision(2))).await;
    assert_eq!(meta(&r.kvs()[0]), m("a", "v-a", 2, 2, 1));
}

// ---------------------------------------------------------------------------
// put options
// ---------------------------------------------------------------------------

#[tokio::test]
async fn put_prev_kv_returns_the_previous_pair() {
    let Fixture { server: _s, mut c } = start().await;
    let r = c.put("k", "1", Some(PutOptions::new().with_prev_key())).await.unwrap();
    assert!(r.prev_key().is_none(), "no previous pair for a new key");
    assert_eq!(r.header().unwrap().revision(), 2);
    let r = c.put("k", "2", Some(PutOptions::new().with_prev_key())).await.unwrap();
    assert_eq!(meta(r.prev_key().expect("prev kv")), m("k", "1", 2, 2, 1));
    assert_eq!(r.header().unwrap().revision(), 3);
    let r = c.put("k", "3", None).await.unwrap();
    assert!(r.prev_key().is_none(), "prev kv only when asked");
    c.delete("k", None).await.unwrap();
    let r = c.put("k", "4", Some(PutOptions::new().with_prev_key())).await.unwrap();
    assert!(r.prev_key().is_none(), "no previous pair after a delete");
}

#[tokio::test]
async fn put_ignore_value_keeps_the_value_and_bumps_version() {
    let Fixture { server: _s, mut c } = start().await;
    put(&mut c, "k", "orig").await;
    let r = c.put("k", "", Some(PutOptions::new().with_ignore_value().with_prev_key())).await.unwrap();
    assert_eq!(r.header().unwrap().revision(), 3);
    assert_eq!(meta(r.prev_key().expect("prev kv")), m("k", "orig", 2, 2, 1));
    assert_eq!(meta(&get_kv(&mut c, "k").await.unwrap()), m("k", "orig", 2, 3, 2));
}

#[tokio::test]
async fn put_ignore_lease_keeps_the_lease_and_sets_the_value() {
    let Fixture { server: _s, mut c } = start().await;
    // without a lease: the value changes, the key stays lease-less
    put(&mut c, "k", "1").await;
    c.put("k", "2", Some(PutOptions::new().with_ignore_lease())).await.unwrap();
    assert_eq!(meta(&get_kv(&mut c, "k").await.unwrap()), m("k", "2", 2, 3, 2));

    // with a lease: ignore_lease keeps it
    let id = c.lease_grant(600, None).await.expect("lease grant").id();
    c.put("l", "1", Some(PutOptions::new().with_lease(id))).await.unwrap();
    c.put("l", "2", Some(PutOptions::new().with_ignore_lease())).await.unwrap();
    let kv = get_kv(&mut c, "l").await.unwrap();
    assert_eq!((s(kv.value()), kv.lease(), kv.version()), ("2".to_string(), id, 2));
    assert!(holds(&mut c, vec![Compare::lease("l", CompareOp::Equal, id)]).await);
    assert!(holds(&mut c, vec![Compare::lease("l", CompareOp::Greater, 0)]).await);
    // ignore_value and ignore_lease together: a pure touch
    c.put("l", "", Some(PutOptions::new().with_ignore_lease().with_ignore_value())).await.unwrap();
    let kv = get_kv(&mut c, "l").await.unwrap();
    assert_eq!((s(kv.value()), kv.lease(), kv.version()), ("2".to_string(), id, 3));
    // ignore_value alone keeps the value but takes the request's lease (none here)
    c.put("l", "", Some(PutOptions::new().with_ignore_value())).await.unwrap();
    let kv = get_kv(&mut c, "l").await.unwrap();
    assert_eq!((s(kv.value()), kv.lease()), ("2".to_string(), 0));
    // a plain put with the lease attaches it again, a plain put without detaches it
    c.put("l", "3", Some(PutOptions::new().with_lease(id))).await.unwrap();
    assert_eq!(get_kv(&mut c, "l").await.unwrap().lease(), id);
    c.put("l", "4", None).await.unwrap();
    assert_eq!(get_kv(&mut c, "l").await.unwrap().lease(), 0);
}

#[tokio::test]
async fn put_ignore_value_or_lease_on_a_missing_key_is_key_not_found() {
    let Fixture { server: _s, mut c } = start().await;
    put(&mut c, "other", "x").await;
    assert_status(
        c.put("missing", "", Some(PutOptions::new().with_ignore_value())).await,
        Code::InvalidArgument,
        KEY_NOT_FOUND,
    );
    assert_status(
        c.put("missing", "v", Some(PutOptions::new().with_ignore_lease())).await,
        Code::InvalidArgument,
        KEY_NOT_FOUND,
    );
    // a deleted key is missing too
    put(&mut c, "gone", "x").await;
    c.delete("gone", None).await.unwrap();
    assert_status(
        c.put("gone", "", Some(PutOptions::new().with_ignore_value())).await,
        Code::InvalidArgument,
        KEY_NOT_FOUND,
    );
    // the same inside a txn: the whole txn fails
    assert_status(
        c.txn(Txn::new().and_then([
            TxnOp::put("fresh", "1", None),
            TxnOp::put("missing", "", Some(PutOptions::new().with_ignore_value())),
        ]))
        .await,
        Code::InvalidArgument,
        KEY_NOT_FOUND,
    );
    // nothing was written by the failed requests
    assert_eq!(current_revision(&mut c).await, 4);
    assert!(get_kv(&mut c, "missing").await.is_none());
    assert!(get_kv(&mut c, "fresh").await.is_none());
}

// ---------------------------------------------------------------------------
// delete range
// ---------------------------------------------------------------------------

#[tokio::test]
async fn delete_single_range_and_prefix() {
    let Fixture { server: _s, mut c } = start().await;
    put_range_dataset(&mut c).await; // revisions 2..=9

    let d = c.delete("b", None).await.unwrap();
    assert_eq!((d.deleted(), d.header().unwrap().revision()), (1, 10));
    assert!(d.prev_kvs().is_empty(), "prev kvs only when asked");

    // [a, foo/1) holds a, c, foo now: one revision for all of them
    let d = c.delete("a", Some(DeleteOptions::new().with_range("foo/1"))).await.unwrap();
    assert_eq!((d.deleted(), d.header().unwrap().revision()), (3, 11));

    let d = c.delete("foo/", Some(DeleteOptions::new().with_prefix())).await.unwrap();
    assert_eq!((d.deleted(), d.header().unwrap().revision()), (2, 12));

    let all = get(&mut c, "", Some(GetOptions::new().with_all_keys())).await;
    assert_eq!(keys(all.kvs()), ["fop", "z"]);

    // every deleted key's tombstone is at the delete's revision: readable just before it
    let at = |r: i64| Some(GetOptions::new().with_all_keys().with_revision(r));
    assert_eq!(keys(get(&mut c, "", at(10)).await.kvs()), ["a", "c", "foo", "foo/1", "foo/2", "fop", "z"]);
    assert_eq!(keys(get(&mut c, "", at(11)).await.kvs()), ["foo/1", "foo/2", "fop", "z"]);

    let d = c.delete("f", Some(DeleteOptions::new().with_from_key())).await.unwrap();
    assert_eq!((d.deleted(), d.header().unwrap().revision()), (2, 13));
    assert!(get(&mut c, "", Some(GetOptions::new().with_all_keys())).await.kvs().is_empty());
}

#[tokio::test]
async fn delete_prev_kv_returns_the_deleted_pairs() {
    let Fixture { server: _s, mut c } = start().await;
    put(&mut c, "p/1", "a").await;
    put(&mut c, "p/2", "b").await;
    put(&mut c, "p/1", "c").await;
    put(&mut c, "q", "d").await;
    let d = c.delete("p/", Some(DeleteOptions::new().with_prefix().with_prev_key())).await.unwrap();
    assert_eq!(d.deleted(), 2);
    assert_eq!(d.prev_kvs().iter().map(meta).collect::<Vec<_>>(), [m("p/1", "c", 2, 4, 2), m("p/2", "b", 3, 3, 1)]);
    let d = c.delete("q", Some(DeleteOptions::new().with_prev_key())).await.unwrap();
    assert_eq!(d.prev_kvs().iter().map(meta).collect::<Vec<_>>(), [m("q", "d", 5, 5, 1)]);
    let d = c.delete("q", Some(DeleteOptions::new().with_prev_key())).await.unwrap();
    assert_eq!(d.deleted(), 0);
    assert!(d.prev_kvs().is_empty());
}

#[tokio::test]
async fn delete_of_nothing_does_not_bump_the_revision() {
    let Fixture { server: _s, mut c } = start().await;
    put(&mut c, "a", "1").await;
    let d = c.delete("missing", None).await.unwrap();
    assert_eq!((d.deleted(), d.header().unwrap().revision()), (0, 2));
    let d = c.delete("x", Some(DeleteOptions::new().with_prefix())).await.unwrap();
    assert_eq!((d.deleted(), d.header().unwrap().revision()), (0, 2));
    c.delete("a", None).await.unwrap();
    let d = c.delete("a", None).await.unwrap();
    assert_eq!((d.deleted(), d.header().unwrap().revision()), (0, 3), "a deleted key");
    assert_eq!(current_revision(&mut c).await, 3);
    assert_eq!(put(&mut c, "b", "1").await, 4, "the next write takes the next revision");
}

// ---------------------------------------------------------------------------
// txn
// ---------------------------------------------------------------------------

/// (op, operand, expected) around an actual value `n`.
fn numeric_cases(n: i64) -> Vec<(CompareOp, i64, bool)> {
    vec![
        (CompareOp::Equal, n, true),
        (CompareOp::Equal, n - 1, false),
        (CompareOp::Equal, n + 1, false),
        (CompareOp::NotEqual, n - 1, true),
        (CompareOp::NotEqual, n, false),
        (CompareOp::Greater, n - 1, true),
        (CompareOp::Greater, n, false),
        (CompareOp::Greater, n + 1, false),
        (CompareOp::Less, n + 1, true),
        (CompareOp::Less, n, false),
        (CompareOp::Less, n - 1, false),
    ]
}

#[tokio::test]
async fn txn_compare_every_target_with_every_result() {
    let Fixture { server: _s, mut c } = start().await;
    put(&mut c, "k", "b").await; // 2
    put(&mut c, "x", "y").await; // 3
    put(&mut c, "k", "b").await; // 4: k: create 2, mod 4, version 2, lease 0

    let value_cases = [
        (CompareOp::Equal, "b", true),
        (CompareOp::Equal, "a", false),
        (CompareOp::Equal, "", false),
        (CompareOp::NotEqual, "a", true),
        (CompareOp::NotEqual, "b", false),
        (CompareOp::Greater, "a", true),
        (CompareOp::Greater, "", true),
        (CompareOp::Greater, "b", false),
        (CompareOp::Greater, "ba", false),
        (CompareOp::Less, "c", true),
        (CompareOp::Less, "ba", true),
        (CompareOp::Less, "b", false),
        (CompareOp::Less, "a", false),
    ];
    for (op, operand, want) in value_cases {
        let got = holds(&mut c, vec![Compare::value("k", op, operand)]).await;
        assert_eq!(got, want, "value(k) {op:?} {operand:?}");
    }
    type Ctor = fn(&'static str, CompareOp, i64) -> Compare;
    let targets: [(&str, Ctor, i64); 4] = [
        ("version", |k, op, v| Compare::version(k, op, v), 2),
        ("create_revision", |k, op, v| Compare::create_revision(k, op, v), 2),
        ("mod_revision", |k, op, v| Compare::mod_revision(k, op, v), 4),
        ("lease", |k, op, v| Compare::lease(k, op, v), 0),
    ];
    for (name, ctor, actual) in targets {
        for (op, operand, want) in numeric_cases(actual) {
            let got = holds(&mut c, vec![ctor("k", op, operand)]).await;
            assert_eq!(got, want, "{name}(k) = {actual}: {op:?} {operand}");
        }
    }
    // several compares: all of them must hold
    assert!(
        holds(
            &mut c,
            vec![
                Compare::value("k", CompareOp::Equal, "b"),
                Compare::version("k", CompareOp::Equal, 2),
                Compare::value("x", CompareOp::Equal, "y"),
            ]
        )
        .await
    );
    assert!(
        !holds(&mut c, vec![Compare::value("k", CompareOp::Equal, "b"), Compare::value("x", CompareOp::Equal, "z"),])
            .await
    );
    // with no compares at all, the txn succeeds
    assert!(holds(&mut c, vec![]).await);
    assert_eq!(current_revision(&mut c).await, 4, "compare-only txns write nothing");
}

#[tokio::test]
async fn txn_compare_over_a_range_requires_every_key_to_match() {
    let Fixture { server: _s, mut c } = start().await;
    put(&mut c, "r/1", "x").await; // 2
    put(&mut c, "r/2", "x").await; // 3
    put(&mut c, "r/3", "y").await; // 4
    put(&mut c, "r0", "x").await; // 5, outside the prefix r/

    let cases: Vec<(Compare, bool)> = vec![
        (Compare::value("r/", CompareOp::Equal, "x").with_prefix(), false),
        (Compare::value("r/1", CompareOp::Equal, "x").with_range("r/3"), true),
        (Compare::value("r/", CompareOp::Less, "z").with_prefix(), true),
        (Compare::value("r/", CompareOp::Greater, "x").with_prefix(), false),
        (Compare::value("r/", CompareOp::NotEqual, "y").with_prefix(), false),
        (Compare::value("r/", CompareOp::NotEqual, "z").with_prefix(), true),
        (Compare::version("r/", CompareOp::Equal, 1).with_prefix(), true),
        (Compare::mod_revision("r/", CompareOp::Greater, 2).with_prefix(), false),
        (Compare::mod_revision("r/", CompareOp::Greater, 1).with_prefix(), true),
        (Compare::mod_revision("r/2", CompareOp::Greater, 2).with_range("r0"), true),
        (Compare::create_revision("r/", CompareOp::Less, 5).with_prefix(), true),
        (Compare::create_revision("r", CompareOp::Less, 5).with_prefix(), false),
        (Compare::lease("r/", CompareOp::Equal, 0).with_prefix(), true),
        // an empty range: a value compare fails, the others compare against zero
        (Compare::value("none/", CompareOp::Equal, "").with_prefix(), false),
        (Compare::value("none/", CompareOp::NotEqual, "x").with_prefix(), false),
        (Compare::version("none/", CompareOp::Equal, 0).with_prefix(), true),
        (Compare::create_revision("none/", CompareOp::Equal, 0).with_prefix(), true),
        (Compare::mod_revision("none/", CompareOp::Less, 1).with_prefix(), true),
        (Compare::version("none/", CompareOp::Greater, 0).with_prefix(), false),
    ];
    for (cmp, want) in cases {
        let desc = format!("{cmp:?}");
        assert_eq!(holds(&mut c, vec![cmp]).await, want, "{desc}");
    }
    put(&mut c, "r/3", "x").await;
    assert!(holds(&mut c, vec![Compare::value("r/", CompareOp::Equal, "x").with_prefix()]).await);
    // a range compare with from-key semantics (range_end "\0"): r/1 r/2 r/3 r0 are all "x"
    assert!(holds(&mut c, vec![Compare::value("r", CompareOp::Equal, "x").with_range("\0")]).await);
    put(&mut c, "zz", "not-x").await;
    assert!(!holds(&mut c, vec![Compare::value("r", CompareOp::Equal, "x").with_range("\0")]).await);
}

#[tokio::test]
async fn txn_compare_on_a_missing_key_value_fails_but_version_0_holds() {
    let Fixture { server: _s, mut c } = start().await;
    let cases: Vec<(Compare, bool)> = vec![
        (Compare::value("m", CompareOp::Equal, ""), false),
        (Compare::value("m", CompareOp::NotEqual, "x"), false),
        (Compare::value("m", CompareOp::Greater, ""), false),
        (Compare::value("m", CompareOp::Less, "zzz"), false),
        (Compare::version("m", CompareOp::Equal, 0), true),
        (Compare::version("m", CompareOp::Greater, 0), false),
        (Compare::version("m", CompareOp::Less, 1), true),
        (Compare::create_revision("m", CompareOp::Equal, 0), true),
        (Compare::mod_revision("m", CompareOp::Equal, 0), true),
        (Compare::lease("m", CompareOp::Equal, 0), true),
    ];
    for (cmp, want) in cases {
        let desc = format!("{cmp:?}");
        assert_eq!(holds(&mut c, vec![cmp]).await, want, "{desc}");
    }

    // create-if-absent: first time the success branch, then the failure branch
    let create = || {
        Txn::new()
            .when([Compare::version("m", CompareOp::Equal, 0)])
            .and_then([TxnOp::put("m", "first", None)])
            .or_else([TxnOp::get("m", None)])
    };
    let r = c.txn(create()).await.unwrap();
    assert!(r.succeeded());
    assert_eq!(txn_rev(&r), 2);
    let r = c.txn(create()).await.unwrap();
    assert!(!r.succeeded());
    assert_eq!(txn_rev(&r), 2);
    let ops = r.op_responses();
    assert_eq!(ops.len(), 1);
    assert_eq!(meta(&as_get(&ops[0]).kvs()[0]), m("m", "first", 2, 2, 1));

    // after a delete the key is missing again
    c.delete("m", None).await.unwrap();
    assert!(holds(&mut c, vec![Compare::version("m", CompareOp::Equal, 0)]).await);
    assert!(!holds(&mut c, vec![Compare::value("m", CompareOp::Equal, "first")]).await);
}

#[tokio::test]
async fn txn_runs_the_success_or_the_failure_branch() {
    let Fixture { server: _s, mut c } = start().await;
    put(&mut c, "flag", "on").await; // 2
    put(&mut c, "gone", "x").await; // 3
    let txn = |flag: &str| {
        Txn::new()
            .when([Compare::value("flag", CompareOp::Equal, flag)])
            .and_then([
                TxnOp::put("s", "yes", Some(PutOptions::new().with_prev_key())),
                TxnOp::get("flag", None),
                TxnOp::delete("gone", Some(DeleteOptions::new().with_prev_key())),
            ])
            .or_else([TxnOp::put("f", "no", None), TxnOp::get("s", None)])
    };

    let r = c.txn(txn("off")).await.unwrap();
    assert!(!r.succeeded());
    assert_eq!(txn_rev(&r), 4);
    let ops = r.op_responses();
    assert_eq!(ops.len(), 2);
    assert!(matches!(ops[0], TxnOpResponse::Put(_)), "{:?}", ops[0]);
    assert!(as_get(&ops[1]).kvs().is_empty(), "s was not written");
    assert_eq!(meta(&get_kv(&mut c, "f").await.unwrap()), m("f", "no", 4, 4, 1));
    assert!(get_kv(&mut c, "s").await.is_none());
    assert!(get_kv(&mut c, "gone").await.is_some());

    let r = c.txn(txn("on")).await.unwrap();
    assert!(r.succeeded());
    assert_eq!(txn_rev(&r), 5);
    let ops = r.op_responses();
    assert_eq!(ops.len(), 3);
    match &ops[0] {
        TxnOpResponse::Put(p) => assert!(p.prev_key().is_none()),
        other => panic!("expected put response, got {other:?}"),
    }
    assert_eq!(meta(&as_get(&ops[1]).kvs()[0]), m("flag", "on", 2, 2, 1));
    match &ops[2] {
        TxnOpResponse::Delete(d) => {
            assert_eq!(d.deleted(), 1);
            assert_eq!(d.prev_kvs().iter().map(meta).collect::<Vec<_>>(), [m("gone", "x", 3, 3, 1)]);
        }
        other => panic!("expected delete response, got {other:?}"),
    }
    assert_eq!(meta(&get_kv(&mut c, "s").await.unwrap()), m("s", "yes", 5, 5, 1));
    assert!(get_kv(&mut c, "gone").await.is_none());

    // a failing compare with an empty failure branch does nothing
    let r = c
        .txn(
            Txn::new()
                .when([Compare::value("flag", CompareOp::Equal, "nope")])
                .and_then([TxnOp::put("s", "again", None)]),
        )
        .await
        .unwrap();
    assert!(!r.succeeded());
    assert!(r.op_responses().is_empty());
    assert_eq!(txn_rev(&r), 5);
    assert_eq!(current_revision(&mut c).await, 5);
}

#[tokio::test]
async fn txn_nested_txns_run_their_own_branches() {
    let Fixture { server: _s, mut c } = start().await;
    put(&mut c, "cfg", "1").await; // 2
                                   // (sibling nested txns must not put the same key, even in branches that do not run)
    let inner = |v: &str| {
        Txn::new()
            .when([Compare::value("cfg", CompareOp::Equal, v)])
            .and_then([TxnOp::put(format!("in{v}/then"), v, None)])
            .or_else([TxnOp::put(format!("in{v}/else"), v, None), TxnOp::get("cfg", None)])
    };
    let r = c
        .txn(Txn::new().when([Compare::version("cfg", CompareOp::Greater, 0)]).and_then([
            TxnOp::put("outer", "x", None),
            TxnOp::txn(inner("1")),
            TxnOp::txn(inner("2")),
        ]))
        .await
        .unwrap();
    assert!(r.succeeded());
    assert_eq!(txn_rev(&r), 3, "all writes of a nested txn share one revision");
    let ops = r.op_responses();
    assert_eq!(ops.len(), 3);
    match (&ops[1], &ops[2]) {
        (TxnOpResponse::Txn(a), TxnOpResponse::Txn(b)) => {
            assert!(a.succeeded());
            assert_eq!(a.op_responses().len(), 1);
            assert!(!b.succeeded());
            let bops = b.op_responses();
            assert_eq!(bops.len(), 2);
            assert_eq!(keys(as_get(&bops[1]).kvs()), ["cfg"]);
        }
        other => panic!("expected two txn responses, got {other:?}"),
    }
    let all = get(&mut c, "", Some(GetOptions::new().with_all_keys())).await;
    assert_eq!(
        all.kvs().iter().map(meta).collect::<Vec<_>>(),
        [m("cfg", "1", 2, 2, 1), m("in1/then", "1", 3, 3, 1), m("in2/else", "2", 3, 3, 1), m("outer", "x", 3, 3, 1),]
    );

    // nested compares are evaluated before any write of the outer txn
    let r = c
        .txn(
            Txn::new().and_then([
                TxnOp::put("cfg", "9", None),
                TxnOp::txn(
                    Txn::new()
                        .when([Compare::value("cfg", CompareOp::Equal, "9")])
                        .and_then([TxnOp::put("saw/9", "", None)])
                        .or_else([TxnOp::put("saw/old", "", None)]),
                ),
            ]),
        )
        .await
        .unwrap();
    assert!(r.succeeded());
    match &r.op_responses()[1] {
        TxnOpResponse::Txn(t) => assert!(!t.succeeded(), "inner compare saw the old value"),
        other => panic!("expected a txn response, got {other:?}"),
    }
    assert!(get_kv(&mut c, "saw/old").await.is_some());
    assert!(get_kv(&mut c, "saw/9").await.is_none());

    // a nested txn in the failure branch
    let r = c
        .txn(
            Txn::new()
                .when([Compare::value("cfg", CompareOp::Equal, "nope")])
                .or_else([TxnOp::txn(Txn::new().and_then([TxnOp::put("deep", "1", None)]))]),
        )
        .await
        .unwrap();
    assert!(!r.succeeded());
    assert_eq!(txn_rev(&r), 5);
    assert!(get_kv(&mut c, "deep").await.is_some());
}

#[tokio::test]
async fn txn_range_sees_the_txns_own_earlier_writes() {
    let Fixture { server: _s, mut c } = start().await;
    put(&mut c, "k", "old").await; // 2
    put(&mut c, "d", "x").await; // 3
    let r = c
        .txn(Txn::new().and_then([
            TxnOp::get("k", None),
            TxnOp::put("k", "new", None),
            TxnOp::get("k", None),
            TxnOp::put("n", "1", None),
            TxnOp::get("", Some(GetOptions::new().with_all_keys().with_count_only())),
            TxnOp::delete("d", None),
            TxnOp::get("d", None),
        ]))
        .await
        .unwrap();
    assert_eq!(txn_rev(&r), 4);
    let ops = r.op_responses();
    assert_eq!(meta(&as_get(&ops[0]).kvs()[0]), m("k", "old", 2, 2, 1));
    assert_eq!(meta(&as_get(&ops[2]).kvs()[0]), m("k", "new", 2, 4, 2));
    assert_eq!(as_get(&ops[4]).count(), 3, "d, k and the new n");
    assert!(as_get(&ops[6]).kvs().is_empty(), "d is deleted within the txn");
    assert_eq!(meta(&get_kv(&mut c, "k").await.unwrap()), m("k", "new", 2, 4, 2));
    assert_eq!(meta(&get_kv(&mut c, "n").await.unwrap()), m("n", "1", 4, 4, 1));
}

#[tokio::test]
async fn txn_op_response_headers_carry_the_revision_seen_by_each_op() {
    let Fixture { server: _s, mut c } = start().await;
    put(&mut c, "k", "old").await; // 2
    put(&mut c, "d", "x").await; // 3
    let r = c
        .txn(Txn::new().and_then([
            TxnOp::get("k", None),
            TxnOp::put("k", "new", None),
            TxnOp::get("k", None),
            TxnOp::delete("d", None),
            TxnOp::get("d", None),
        ]))
        .await
        .unwrap();
    assert_eq!(txn_rev(&r), 4);
    // a range before the txn's first write reports the revision before the txn; every response
    // after a write reports the txn's own revision (etcd: storeTxnWrite.Range uses beginRev + 1
    // once the txn has changes)
    let op_revs: Vec<i64> = r
        .op_responses()
        .iter()
        .map(|op| {
            let h = match op {
                TxnOpResponse::Get(r) => r.header(),
                TxnOpResponse::Put(r) => r.header(),
                TxnOpResponse::Delete(r) => r.header(),
                TxnOpResponse::Txn(r) => r.header(),
            };
            h.expect("op response header").revision()
        })
        .collect();
    assert_eq!(op_revs, [3, 4, 4, 4, 4], "header revisions of get, put, get, delete, get");

    // in a read-only txn every range reports the current revision
    let r = c.txn(Txn::new().and_then([TxnOp::get("k", None), TxnOp::get("d", None)])).await.unwrap();
    let op_revs: Vec<i64> = r.op_responses().iter().map(|op| as_get(op).header().expect("header").revision()).collect();
    assert_eq!(op_revs, [4, 4]);
}

#[tokio::test]
async fn txn_writes_share_one_revision_and_read_only_txns_do_not_bump_it() {
    let Fixture { server: _s, mut c } = start().await;
    put(&mut c, "a", "0").await; // 2
    let r = c
        .txn(Txn::new().and_then([TxnOp::put("a", "1", None), TxnOp::put("b", "1", None), TxnOp::put("c", "1", None)]))
        .await
        .unwrap();
    assert_eq!(txn_rev(&r), 3, "one revision for the whole txn");
    let all = get(&mut c, "", Some(GetOptions::new().with_all_keys())).await;
    assert_eq!(
        all.kvs().iter().map(meta).collect::<Vec<_>>(),
        [m("a", "1", 2, 3, 2), m("b", "1", 3, 3, 1), m("c", "1", 3, 3, 1)]
    );

    // read-only txns: header is the current revision, nothing is bumped
    let r = c
        .txn(
            Txn::new()
                .when([Compare::value("a", CompareOp::Equal, "1")])
                .and_then([TxnOp::get("a", None), TxnOp::get("", Some(GetOptions::new().with_all_keys()))]),
        )
        .await
        .unwrap();
    assert!(r.succeeded());
    assert_eq!(txn_rev(&r), 3);
    let r = c.txn(Txn::new()).await.unwrap();
    assert!(r.succeeded());
    assert_eq!(txn_rev(&r), 3, "empty txn");
    // a txn whose only write is a delete of nothing does not bump the revision either
    let r = c.txn(Txn::new().and_then([TxnOp::delete("missing", None)])).await.unwrap();
    assert_eq!(txn_rev(&r), 3);
    assert_eq!(current_revision(&mut c).await, 3);
    // a txn with a put and a delete: one revision
    let r = c.txn(Txn::new().and_then([TxnOp::put("d", "1", None), TxnOp::delete("a", None)])).await.unwrap();
    assert_eq!(txn_rev(&r), 4);
    assert_eq!(put(&mut c, "e", "1").await, 5);
}

// ---------------------------------------------------------------------------
// compaction
// ---------------------------------------------------------------------------

/// a=1 (2), a=2 (3), b=1 (4), del b (5), a=3 (6), c=1 (7); returns after compacting at 6.
async fn compacted_store(c: &mut Client) {
    put(c, "a", "1").await;
    put(c, "a", "2").await;
    put(c, "b", "1").await;
    c.delete("b", None).await.unwrap();
    put(c, "a", "3").await;
    assert_eq!(put(c, "c", "1").await, 7);
    let r = c.compact(6, None).await.unwrap();
    assert_eq!(r.header().unwrap().revision(), 7, "compact response header: current revision");
    assert_eq!(current_revision(c).await, 7, "a compaction is not a revision");
}

#[tokio::test]
async fn compact_reads_below_the_compacted_revision_fail() {
    let Fixture { server: _s, mut c } = start().await;
    compacted_store(&mut c).await;
    for r in [2, 3, 5] {
        assert_status(c.get("a", Some(GetOptions::new().with_revision(r))).await, Code::OutOfRange, COMPACTED);
        assert_status(
            c.get("", Some(GetOptions::new().with_all_keys().with_revision(r).with_count_only())).await,
            Code::OutOfRange,
            COMPACTED,
        );
    }
    // also a range inside a txn
    assert_status(
        c.txn(Txn::new().and_then([TxnOp::get("a", Some(GetOptions::new().with_revision(5)))])).await,
        Code::OutOfRange,
        COMPACTED,
    );
    // and a write txn that contains such a range is rejected as a whole
    assert_status(
        c.txn(
            Txn::new()
                .and_then([TxnOp::put("w", "1", None), TxnOp::get("a", Some(GetOptions::new().with_revision(5)))]),
        )
        .await,
        Code::OutOfRange,
        COMPACTED,
    );
    assert!(get_kv(&mut c, "w").await.is_none());
    assert_eq!(current_revision(&mut c).await, 7);
}

#[tokio::test]
async fn compact_keeps_the_latest_value_of_each_key_at_the_compacted_revision() {
    let Fixture { server: _s, mut c } = start().await;
    compacted_store(&mut c).await;
    let at6 = get(&mut c, "", Some(GetOptions::new().with_all_keys().with_revision(6))).await;
    assert_eq!(
        at6.kvs().iter().map(meta).collect::<Vec<_>>(),
        [m("a", "3", 2, 6, 3)],
        "at the compacted revision: a's latest value; b (deleted at 5) gone; c not yet created"
    );
    assert_eq!(at6.count(), 1);
    assert!(get(&mut c, "b", Some(GetOptions::new().with_revision(6))).await.kvs().is_empty());
    let at7 = get(&mut c, "", Some(GetOptions::new().with_all_keys().with_revision(7))).await;
    assert_eq!(keys(at7.kvs()), ["a", "c"]);
    // the latest state keeps create revisions and versions from before the compaction
    assert_eq!(meta(&get_kv(&mut c, "a").await.unwrap()), m("a", "3", 2, 6, 3));
    assert_eq!(put(&mut c, "a", "4").await, 8);
    assert_eq!(meta(&get_kv(&mut c, "a").await.unwrap()), m("a", "4", 2, 8, 4));
    // a deleted-and-compacted key is re-created from scratch
    assert_eq!(put(&mut c, "b", "2").await, 9);
    assert_eq!(meta(&get_kv(&mut c, "b").await.unwrap()), m("b", "2", 9, 9, 1));
    // compacting at the current revision is allowed; then only the current revision is readable
    // (a physical compaction: the response comes once the old revisions are removed)
    c.compact(9, Some(CompactionOptions::new().with_physical())).await.unwrap();
    assert_status(c.get("a", Some(GetOptions::new().with_revision(8))).await, Code::OutOfRange, COMPACTED);
    assert_eq!(meta(&get(&mut c, "a", Some(GetOptions::new().with_revision(9))).await.kvs()[0]), m("a", "4", 2, 8, 4));
}

#[tokio::test]
async fn compact_twice_or_below_is_compacted_and_future_revisions_fail() {
    let Fixture { server: _s, mut c } = start().await;
    // reading or compacting a future revision, before any compaction
    assert_status(c.get("a", Some(GetOptions::new().with_revision(2))).await, Code::OutOfRange, FUTURE_REV);
    compacted_store(&mut c).await;
    assert_status(c.compact(6, None).await, Code::OutOfRange, COMPACTED);
    assert_status(c.compact(3, None).await, Code::OutOfRange, COMPACTED);
    assert_status(c.compact(8, None).await, Code::OutOfRange, FUTURE_REV);
    assert_status(c.compact(1000, None).await, Code::OutOfRange, FUTURE_REV);
    assert_status(c.get("a", Some(GetOptions::new().with_revision(8))).await, Code::OutOfRange, FUTURE_REV);
    assert_status(
        c.get("", Some(GetOptions::new().with_all_keys().with_revision(100))).await,
        Code::OutOfRange,
        FUTURE_REV,
    );
    assert_status(
        c.txn(Txn::new().and_then([TxnOp::get("a", Some(GetOptions::new().with_revision(8)))])).await,
        Code::OutOfRange,
        FUTURE_REV,
    );
    // the current revision is readable, and a later compaction is still possible
    assert_eq!(get(&mut c, "c", Some(GetOptions::new().with_revision(7))).await.kvs().len(), 1);
    c.compact(7, None).await.unwrap();
    assert_status(c.compact(7, None).await, Code::OutOfRange, COMPACTED);
}

// ---------------------------------------------------------------------------
// request errors: gRPC code and exact message
// ---------------------------------------------------------------------------

#[tokio::test]
async fn error_empty_key_is_not_provided() {
    let Fixture { server: _s, mut c } = start().await;
    let ia = Code::InvalidArgument;
    assert_status(c.get("", None).await, ia, EMPTY_KEY);
    assert_status(c.get("", Some(GetOptions::new().with_range("z"))).await, ia, EMPTY_KEY);
    assert_status(c.put("", "v", None).await, ia, EMPTY_KEY);
    assert_status(c.delete("", None).await, ia, EMPTY_KEY);
    assert_status(c.delete("", Some(DeleteOptions::new().with_range("z"))).await, ia, EMPTY_KEY);
    assert_status(c.txn(Txn::new().when([Compare::value("", CompareOp::Equal, "v")])).await, ia, EMPTY_KEY);
    assert_status(
        c.txn(Txn::new().when([Compare::version("", CompareOp::Equal, 0).with_range("z")])).await,
        ia,
        EMPTY_KEY,
    );
    assert_status(c.txn(Txn::new().and_then([TxnOp::put("", "v", None)])).await, ia, EMPTY_KEY);
    assert_status(c.txn(Txn::new().and_then([TxnOp::get("", None)])).await, ia, EMPTY_KEY);
    assert_status(c.txn(Txn::new().or_else([TxnOp::delete("", None)])).await, ia, EMPTY_KEY);
    assert_status(
        c.txn(Txn::new().and_then([TxnOp::txn(Txn::new().and_then([TxnOp::put("", "v", None)]))])).await,
        ia,
        EMPTY_KEY,
    );
    assert_eq!(current_revision(&mut c).await, 1);
}

#[tokio::test]
async fn error_ignore_value_with_a_value_and_ignore_lease_with_a_lease() {
    let Fixture { server: _s, mut c } = start().await;
    put(&mut c, "k", "v").await;
    let ia = Code::InvalidArgument;
    assert_status(c.put("k", "x", Some(PutOptions::new().with_ignore_value())).await, ia, VALUE_PROVIDED);
    assert_status(
        c.txn(Txn::new().and_then([TxnOp::put("k", "x", Some(PutOptions::new().with_ignore_value()))])).await,
        ia,
        VALUE_PROVIDED,
    );
    assert_status(
        c.put("k", "x", Some(PutOptions::new().with_ignore_lease().with_lease(12345))).await,
        ia,
        LEASE_PROVIDED,
    );
    assert_status(
        c.txn(Txn::new().or_else([TxnOp::put("k", "x", Some(PutOptions::new().with_ignore_lease().with_lease(7)))]))
            .await,
        ia,
        LEASE_PROVIDED,
    );
    // validation comes before the existence check: also on a missing key
    assert_status(c.put("missing", "x", Some(PutOptions::new().with_ignore_value())).await, ia, VALUE_PROVIDED);
    assert_status(
        c.put("missing", "x", Some(PutOptions::new().with_ignore_lease().with_lease(1))).await,
        ia,
        LEASE_PROVIDED,
    );
    assert_eq!(current_revision(&mut c).await, 2);
}

fn puts(n: usize) -> Vec<TxnOp> {
    (0..n).map(|i| TxnOp::put(format!("op/{i:04}"), "v", None)).collect()
}

#[tokio::test]
async fn error_txn_with_more_than_128_ops_is_too_many_operations() {
    let Fixture { server: _s, mut c } = start().await;
    let ia = Code::InvalidArgument;
    assert_status(c.txn(Txn::new().and_then(puts(129))).await, ia, TOO_MANY_OPS);
    assert_status(c.txn(Txn::new().or_else(puts(129))).await, ia, TOO_MANY_OPS);
    let compares: Vec<Compare> = (0..129).map(|i| Compare::version(format!("c/{i}"), CompareOp::Equal, 0)).collect();
    assert_status(c.txn(Txn::new().when(compares)).await, ia, TOO_MANY_OPS);
    assert_eq!(current_revision(&mut c).await, 1);

    // 128 in each of compare, success and failure is fine
    let compares: Vec<Compare> = (0..128).map(|i| Compare::version(format!("c/{i}"), CompareOp::Equal, 0)).collect();
    let r = c.txn(Txn::new().when(compares).and_then(puts(128)).or_else(puts(128))).await.unwrap();
    assert!(r.succeeded());
    assert_eq!(txn_rev(&r), 2);
    let count = get(&mut c, "op/", Some(GetOptions::new().with_prefix().with_count_only())).await;
    assert_eq!(count.count(), 128);
}

#[tokio::test]
async fn error_max_txn_ops_flag_limits_the_ops_per_txn() {
    let Fixture { server: _s, mut c } = start_with(&["--max-txn-ops", "4"]).await;
    assert_status(c.txn(Txn::new().and_then(puts(5))).await, Code::InvalidArgument, TOO_MANY_OPS);
    let r = c.txn(Txn::new().and_then(puts(4))).await.unwrap();
    assert_eq!(txn_rev(&r), 2);
}

#[tokio::test]
async fn error_duplicate_key_in_txn() {
    let Fixture { server: _s, mut c } = start().await;
    let ia = Code::InvalidArgument;
    // two puts of the same key
    assert_status(
        c.txn(Txn::new().and_then([TxnOp::put("k", "1", None), TxnOp::put("k", "2", None)])).await,
        ia,
        DUPLICATE_KEY,
    );
    assert_status(
        c.txn(Txn::new().or_else([TxnOp::put("k", "1", None), TxnOp::put("k", "2", None)])).await,
        ia,
        DUPLICATE_KEY,
    );
    // a put and a delete range covering it, in either order
    assert_status(
        c.txn(
            Txn::new()
                .and_then([TxnOp::put("k", "1", None), TxnOp::delete("a", Some(DeleteOptions::new().with_range("z")))]),
        )
        .await,
        ia,
        DUPLICATE_KEY,
    );
    assert_status(
        c.txn(
            Txn::new()
                .and_then([TxnOp::delete("k", Some(DeleteOptions::new().with_prefix())), TxnOp::put("k/1", "1", None)]),
        )
        .await,
        ia,
        DUPLICATE_KEY,
    );
    assert_status(
        c.txn(Txn::new().and_then([TxnOp::delete("k", None), TxnOp::put("k", "1", None)])).await,
        ia,
        DUPLICATE_KEY,
    );
    // a put in the outer txn and the same key in a nested one
    assert_status(
        c.txn(
            Txn::new()
                .and_then([TxnOp::put("k", "1", None), TxnOp::txn(Txn::new().and_then([TxnOp::put("k", "2", None)]))]),
        )
        .await,
        ia,
        DUPLICATE_KEY,
    );
    // the same key in two sibling nested txns, even if only one of the branches can run
    assert_status(
        c.txn(Txn::new().and_then([
            TxnOp::txn(Txn::new().and_then([TxnOp::put("k", "1", None)])),
            TxnOp::txn(Txn::new().or_else([TxnOp::put("k", "2", None)])),
        ]))
        .await,
        ia,
        DUPLICATE_KEY,
    );
    // a delete range in a nested txn covering a put of the outer txn
    assert_status(
        c.txn(Txn::new().and_then([
            TxnOp::put("k", "1", None),
            TxnOp::txn(Txn::new().or_else([TxnOp::delete("k", Some(DeleteOptions::new().with_prefix()))])),
        ]))
        .await,
        ia,
        DUPLICATE_KEY,
    );
    assert_eq!(current_revision(&mut c).await, 1);

    // not duplicates: the same key in the two branches, gets, overlapping deletes, a put just
    // outside a delete range, and the same key in the two branches of a nested txn
    let ok = [
        Txn::new().and_then([TxnOp::put("k", "1", None)]).or_else([TxnOp::put("k", "2", None)]),
        Txn::new().and_then([TxnOp::put("g", "1", None), TxnOp::get("g", None), TxnOp::get("g", None)]),
        Txn::new().and_then([
            TxnOp::delete("a", Some(DeleteOptions::new().with_range("m"))),
            TxnOp::delete("c", Some(DeleteOptions::new().with_range("z"))),
            TxnOp::delete("c", None),
        ]),
        Txn::new()
            .and_then([TxnOp::delete("a", Some(DeleteOptions::new().with_range("m"))), TxnOp::put("m", "1", None)]),
        Txn::new().and_then([
            TxnOp::put("n", "1", None),
            TxnOp::txn(Txn::new().and_then([TxnOp::put("n2", "1", None)]).or_else([TxnOp::put("n2", "2", None)])),
        ]),
    ];
    for txn in ok {
        let desc = format!("{txn:?}");
        c.txn(txn).await.unwrap_or_else(|e| panic!("{desc}: {e}"));
    }
}

#[tokio::test]
async fn error_request_larger_than_max_request_bytes_is_too_large() {
    let Fixture { server: _s, mut c } = start_with(&["--max-request-bytes", "1024"]).await;
    let big = "x".repeat(2000);
    let ia = Code::InvalidArgument;
    assert_status(c.put("big", big.as_str(), None).await, ia, TOO_LARGE);
    assert_status(c.txn(Txn::new().and_then([TxnOp::put("big", big.as_str(), None)])).await, ia, TOO_LARGE);
    assert_eq!(current_revision(&mut c).await, 1);
    let small = "y".repeat(500);
    assert_eq!(put(&mut c, "small", &small).await, 2);
    assert_eq!(s(get_kv(&mut c, "small").await.unwrap().value()), small);
}

#[tokio::test]
async fn error_put_with_an_unknown_lease_is_lease_not_found() {
    let Fixture { server: _s, mut c } = start().await;
    assert_status(c.put("k", "v", Some(PutOptions::new().with_lease(12345))).await, Code::NotFound, LEASE_NOT_FOUND);
    assert_status(
        c.txn(
            Txn::new().and_then([
                TxnOp::put("a", "v", None),
                TxnOp::put("k", "v", Some(PutOptions::new().with_lease(12345))),
            ]),
        )
        .await,
        Code::NotFound,
        LEASE_NOT_FOUND,
    );
    assert_eq!(current_revision(&mut c).await, 1);
    assert!(get_kv(&mut c, "a").await.is_none());
}

#[tokio::test]
async fn error_precedence_too_many_ops_then_empty_key_then_duplicate() {
    let Fixture { server: _s, mut c } = start().await;
    let ia = Code::InvalidArgument;
    let mut ops = puts(129);
    ops.push(TxnOp::put("", "v", None));
    assert_status(
        c.txn(Txn::new().when([Compare::value("", CompareOp::Equal, "")]).and_then(ops)).await,
        ia,
        TOO_MANY_OPS,
    );
    assert_status(
        c.txn(Txn::new().and_then([TxnOp::put("d", "1", None), TxnOp::put("d", "1", None), TxnOp::put("", "1", None)]))
            .await,
        ia,
        EMPTY_KEY,
    );
    // in a txn, a missing key for ignore_value is reported before an unknown lease
    assert_status(
        c.txn(Txn::new().and_then([TxnOp::put(
            "missing",
            "",
            Some(PutOptions::new().with_ignore_value().with_lease(12345)),
        )]))
        .await,
        ia,
        KEY_NOT_FOUND,
    );
    // ops of the branch that does not run are not checked against the store
    let r = c
        .txn(Txn::new().and_then([TxnOp::get("a", None)]).or_else([
            TxnOp::get("a", Some(GetOptions::new().with_revision(99))),
            TxnOp::put("missing", "", Some(PutOptions::new().with_ignore_value())),
            TxnOp::put("x", "", Some(PutOptions::new().with_lease(12345))),
        ]))
        .await
        .unwrap();
    assert!(r.succeeded());
    // but the request validation covers both branches
    assert_status(
        c.txn(
            Txn::new()
                .and_then([TxnOp::get("a", None)])
                .or_else([TxnOp::put("d", "", None), TxnOp::put("d", "", None)]),
        )
        .await,
        ia,
        DUPLICATE_KEY,
    );
}

#[tokio::test]
async fn error_put_checks_the_lease_before_ignore_value_on_a_missing_key() {
    let Fixture { server: _s, mut c } = start().await;
    // etcd's applier looks the lease up first for a plain put (and second inside a txn)
    assert_status(
        c.put("missing", "", Some(PutOptions::new().with_ignore_value().with_lease(12345))).await,
        Code::NotFound,
        LEASE_NOT_FOUND,
    );
}

#[tokio::test]
async fn error_write_txn_checks_its_puts_before_its_ranges() {
    let Fixture { server: _s, mut c } = start().await;
    put(&mut c, "a", "1").await; // 2
    put(&mut c, "a", "2").await; // 3
    c.compact(3, None).await.unwrap();
    // a compacted range and an unknown lease in one write txn: the lease error wins
    assert_status(
        c.txn(Txn::new().and_then([
            TxnOp::get("a", Some(GetOptions::new().with_revision(2))),
            TxnOp::put("b", "", Some(PutOptions::new().with_lease(12345))),
        ]))
        .await,
        Code::NotFound,
        LEASE_NOT_FOUND,
    );
}
