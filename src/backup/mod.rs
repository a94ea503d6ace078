//! keyward's one-shot backup commands: `keyward snapshot save|restore|status` (etcdctl's and etcdutl's)
//! and `keyward migrate` (an etcd data dir into keyward's); their flags are in `cli/backup.rs`.

pub(crate) mod export;
pub(crate) mod migrate;
pub(crate) mod restore;
pub(crate) mod snapshot;
