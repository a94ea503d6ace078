//! Alarms (etcd's `alarm` bucket and `v3alarm.AlarmStore`): which member raised which alarm.
//!
//! Replicated state: changed only by applying `AlarmRequest` entries, in the state machine's LMDB
//! environment and its snapshots, so every member refuses the same requests while an alarm is active.
//! Only NOSPACE has an effect (etcd's `applierV3Capped`, see `apply/capped.rs`): puts, txns with a put and
//! lease grants are refused until it is disarmed. This module owns the table and its encoding, not
//! the decision when to raise an alarm (`node/propose.rs`, `node/jobs/space.rs`, `space/mod.rs`).

use heed::RoTxn;

use crate::proto::etcdserverpb::{AlarmMember, AlarmType};
use crate::storage::Db;

/// One record per (alarm, member); the value is empty. The key starts with the alarm type, so the
/// members with one alarm are a prefix.
pub(crate) struct AlarmStore {
    alarms: Db,
}

fn key(alarm: i32, member_id: u64) -> [u8; 12] {
    let mut key = [0u8; 12];
    key[..4].copy_from_slice(&(alarm as u32).to_be_bytes());
    key[4..].copy_from_slice(&member_id.to_be_bytes());
    key
}

fn decode(key: &[u8]) -> Option<AlarmMember> {
    let alarm = u32::from_be_bytes(key.get(..4)?.try_into().ok()?) as i32;
    let member_id = u64::from_be_bytes(key.get(4..12)?.try_into().ok()?);
    Some(AlarmMember { member_id, alarm })
}

impl AlarmStore {
    pub(crate) const TABLES: [&'static str; 1] = ["alarms"];

    pub(crate) fn new([alarms]: [Db; 1]) -> Self {
        AlarmStore { alarms }
    }

    pub(crate) fn tables(&self) -> Vec<Db> {
        vec![self.alarms]
    }

    /// The alarms of type `alarm`, or all of them for `AlarmType::None` (as etcd's `Get`).
    pub(crate) fn list(&self, txn: &RoTxn, alarm: i32) -> heed::Result<Vec<AlarmMember>> {
        let decoded = |item: heed::Result<(&[u8], &[u8])>| item.map(|(k, _)| decode(k));
        let members: Vec<Option<AlarmMember>> = if alarm == AlarmType::None as i32 {
            self.alarms.iter(txn)?.map(decoded).collect::<heed::Result<_>>()?
        } else {
            // The alarm type leads the key: one type's members are a prefix.
            self.alarms.prefix_iter(txn, &key(alarm, 0)[..4])?.map(decoded).collect::<heed::Result<_>>()?
        };
        Ok(members.into_iter().flatten().collect())
    }

    /// Whether any member has raised `alarm`. Asked for every put while applying: with no alarm at
    /// all (the usual case) the table's record count answers without a cursor.
    pub(crate) fn active(&self, txn: &RoTxn, alarm: AlarmType) -> heed::Result<bool> {
        if self.alarms.stat(txn)?.entries == 0 {
            return Ok(false);
        }
        Ok(self.alarms.prefix_iter(txn, &key(alarm as i32, 0)[..4])?.next().transpose()?.is_some())
    }

    /// Records `alarm` for `member_id`; returns the alarm and whether it was new.
    pub(crate) fn activate(
        &self,
        txn: &mut heed::RwTxn,
        member_id: u64,
        alarm: i32,
    ) -> heed::Result<(AlarmMember, bool)> {
        let k = key(alarm, member_id);
        let new = self.alarms.get(txn, &k)?.is_none();
        if new {
            self.alarms.put(txn, &k, &[])?;
        }
        Ok((AlarmMember { member_id, alarm }, new))
    }

    /// Clears `alarm` for `member_id`; returns it if it was set.
    pub(crate) fn deactivate(
        &self,
        txn: &mut heed::RwTxn,
        member_id: u64,
        alarm: i32,
    ) -> heed::Result<Option<AlarmMember>> {
        let existed = self.alarms.delete(txn, &key(alarm, member_id))?;
        Ok(existed.then_some(AlarmMember { member_id, alarm }))
    }
}

/// An alarm as Go's protobuf text format prints it (etcd's `AlarmMember.String()`), the way `etcdctl
/// endpoint status` shows it among a member's errors: `memberID:1234 alarm:NOSPACE ` (trailing space
/// included).
pub(crate) fn go_text(member: &AlarmMember) -> String {
    let mut out = String::new();
    if member.member_id != 0 {
        out.push_str(&format!("memberID:{} ", member.member_id));
    }
    if member.alarm != 0 {
        match AlarmType::try_from(member.alarm) {
            Ok(t) => out.push_str(&format!("alarm:{} ", t.as_str_name())),
            Err(_) => out.push_str(&format!("alarm:{} ", member.alarm)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{self, Durability};

    #[test]
    fn alarms_are_listed_by_type_and_cleared_per_member() {
        let dir = tempfile::tempdir().unwrap();
        let (env, dbs) = storage::open(dir.path(), AlarmStore::TABLES, Durability::Full).unwrap();
        let store = AlarmStore::new(dbs);
        let (nospace, corrupt) = (AlarmType::Nospace as i32, AlarmType::Corrupt as i32);
        let mut txn = env.write_txn().unwrap();
        assert!(!store.active(&txn, AlarmType::Nospace).unwrap());
        assert!(store.activate(&mut txn, 7, nospace).unwrap().1);
        assert!(!store.activate(&mut txn, 7, nospace).unwrap().1, "raising twice records it once");
        store.activate(&mut txn, 3, corrupt).unwrap();
        store.activate(&mut txn, u64::MAX, nospace).unwrap();
        assert!(store.active(&txn, AlarmType::Nospace).unwrap());
        let all = store.list(&txn, AlarmType::None as i32).unwrap();
        assert_eq!(all.len(), 3);
        let members: Vec<u64> = store.list(&txn, nospace).unwrap().iter().map(|m| m.member_id).collect();
        assert_eq!(members, [7, u64::MAX]);
        assert_eq!(store.deactivate(&mut txn, 7, nospace).unwrap(), Some(AlarmMember { member_id: 7, alarm: nospace }));
        assert_eq!(store.deactivate(&mut txn, 7, nospace).unwrap(), None);
        assert!(store.active(&txn, AlarmType::Nospace).unwrap(), "another member still has it");
        store.deactivate(&mut txn, u64::MAX, nospace).unwrap();
        assert!(!store.active(&txn, AlarmType::Nospace).unwrap());
        assert!(store.active(&txn, AlarmType::Corrupt).unwrap());
    }

    #[test]
    fn text_form_is_gos() {
        let m = AlarmMember { member_id: 3319814642761637952, alarm: AlarmType::Nospace as i32 };
        assert_eq!(go_text(&m), "memberID:3319814642761637952 alarm:NOSPACE ");
    }
}
