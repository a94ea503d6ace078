//! The tables an entry is applied to, borrowed from the state machine for one write transaction.

use crate::auth::simple::SimpleTokens;
use crate::auth::store::AuthStore;
use crate::lease::store::LeaseStore;
use crate::mvcc::KvStore;
use crate::space::alarm::AlarmStore;

/// The replicated tables an entry can change, and the member-local token table that Authenticate
/// entries fill.
pub(crate) struct Stores<'a> {
    pub kv: &'a KvStore,
    pub leases: &'a LeaseStore,
    pub auth: &'a AuthStore,
    pub alarms: &'a AlarmStore,
    pub simple_tokens: Option<&'a SimpleTokens>,
}
