//! Alarm entries: raising, clearing and listing the replicated alarms (`space/alarm.rs`).

use heed::RwTxn;

use super::outcome::{Applied, Effects};
use super::stores::Stores;
use crate::error::EtcdError;
use crate::proto::etcdserverpb::alarm_request::AlarmAction;
use crate::proto::etcdserverpb::{AlarmRequest, AlarmResponse};

/// etcd's `applierV3backend.Alarm`: ACTIVATE records the alarm and answers it (also when it was
/// already set), DEACTIVATE clears it and answers it if it was set, GET lists (`AlarmType::None`:
/// every alarm). The response has no header, as etcd's.
pub(super) fn apply(stores: &Stores, txn: &mut RwTxn, req: &AlarmRequest) -> Result<(Applied, Effects), EtcdError> {
    let mut resp = AlarmResponse::default();
    let mut changed = false;
    match AlarmAction::try_from(req.action) {
        Ok(AlarmAction::Get) => resp.alarms = stores.alarms.list(txn, req.alarm)?,
        Ok(AlarmAction::Activate) => {
            let (member, new) = stores.alarms.activate(txn, req.member_id, req.alarm)?;
            if new {
                tracing::warn!(alarm = %crate::space::alarm::go_text(&member), "alarm raised");
            }
            changed = new;
            resp.alarms.push(member);
        }
        Ok(AlarmAction::Deactivate) => {
            if let Some(member) = stores.alarms.deactivate(txn, req.member_id, req.alarm)? {
                tracing::warn!(alarm = %crate::space::alarm::go_text(&member), "alarm disarmed");
                changed = true;
                resp.alarms.push(member);
            }
        }
        Err(_) => return Err(EtcdError::Unsupported(format!("unknown alarm action {}", req.action))),
    }
    Ok((Applied::Alarm(resp), Effects { alarms_changed: changed, ..Default::default() }))
}
