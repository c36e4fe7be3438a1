//! An `escalate` decision asked of the user: an MCP elicitation (`elicitation/create`, a form
//! with one boolean, `approve`) sent to the client of the call being served. Accepted with
//! `approve: true` allows; anything else (declined, cancelled, `approve: false`, no answer
//! within the approval timeout, a client without the elicitation capability) denies, with
//! the reason said in the result.

use std::time::Duration;

use rmcp::model::{ElicitRequestParams, ElicitationAction, ElicitationSchema};
use rmcp::service::{Peer, RoleServer};

/// Asks the user `message`; `Ok` when approved, else why not.
pub async fn ask(
    peer: &Peer<RoleServer>,
    message: String,
    timeout: Duration,
) -> Result<(), String> {
    let schema = ElicitationSchema::builder()
        .required_bool_property("approve", |b| {
            b.description("Allow it? (true: allow, false: deny)")
        })
        .build()
        .map_err(|e| format!("needs approval (cannot ask: {e})"))?;
    let supported = peer
        .peer_info()
        .is_some_and(|info| info.capabilities.elicitation.is_some());
    if !supported {
        return Err(
            "needs approval, and the client cannot be asked (it does not support MCP elicitation)"
                .into(),
        );
    }
    let params = ElicitRequestParams::FormElicitationParams {
        meta: None,
        message,
        requested_schema: schema,
    };
    match peer
        .create_elicitation_with_timeout(params, Some(timeout))
        .await
    {
        Ok(r) => match r.action {
            ElicitationAction::Accept
                if r.content
                    .as_ref()
                    .and_then(|c| c.get("approve"))
                    .and_then(|v| v.as_bool())
                    == Some(true) =>
            {
                Ok(())
            }
            ElicitationAction::Accept => Err("the user answered no".into()),
            ElicitationAction::Decline => Err("the user declined".into()),
            _ => Err("the user cancelled the question".into()),
        },
        Err(rmcp::service::ServiceError::Timeout { .. }) => {
            Err(format!("no answer within {}s", timeout.as_secs()))
        }
        Err(e) => Err(format!("the question could not be asked: {e}")),
    }
}
