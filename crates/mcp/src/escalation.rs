//! An `escalate` decision asked of the user: an MCP elicitation (`elicitation/create`, a form
//! with one boolean, `approve`) sent to the client of the call being served. Accepted with
//! `approve: true` allows; anything else (declined, cancelled, `approve: false`, no answer
//! within the approval timeout, a client without the elicitation capability) denies, with
//! the reason said in the result.
//!
//! Two things escalate: a connection (the session's egress proxy asks [`McpApprover`] while
//! it holds the connection, on its own thread) and a `write_file` to an `escalate_write`
//! path ([`settle`], before anything is written).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentrun_policy::{
    Action, Answer, Approval, ApprovalFuture, Approver, Decision, EscalationRequest,
};
use agentrun_pool::lock;
use rmcp::model::{ElicitRequestParams, ElicitationAction, ElicitationSchema};
use rmcp::service::{Peer, RoleServer};

/// The client of a session's latest call: who an escalation asks.
pub type PeerSlot = Arc<Mutex<Option<Peer<RoleServer>>>>;

/// The approver of a session's egress proxy: asks the session's client. The proxy polls
/// the answer on a plain thread, so the elicitation runs on the server's runtime and the
/// future only waits for its result.
pub struct McpApprover {
    pub peer: PeerSlot,
    pub runtime: tokio::runtime::Handle,
    pub timeout: Duration,
}

impl Approver for McpApprover {
    fn ask(&self, request: EscalationRequest) -> ApprovalFuture {
        let peer = lock(&self.peer).clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let timeout = self.timeout;
        self.runtime.spawn(async move {
            let answer = match peer {
                Some(p) => ask(&p, request.question(), timeout).await,
                None => Err("needs approval, and there is no client to ask".into()),
            };
            let _ = tx.send(answer);
        });
        Box::pin(async move {
            match rx.await {
                Ok(Ok(())) => Approval::Approved,
                Ok(Err(why)) => Approval::Denied { why },
                Err(_) => Approval::Denied {
                    why: "the server stopped before an answer came".into(),
                },
            }
        })
    }
}

/// An escalate decision on `action` in sandbox `sandbox_id` asked of `peer` and settled
/// (approved, denied, or timed out after `timeout`).
pub async fn settle(
    peer: Option<&Peer<RoleServer>>,
    sandbox_id: &str,
    action: &Action,
    d: Decision,
    timeout: Duration,
) -> Decision {
    let request = EscalationRequest::new(sandbox_id, action, &d);
    let answer = match peer {
        None => Answer::NoApprover("there is no client to ask".into()),
        Some(p) if !can_ask(p) => Answer::NoApprover(
            "the client cannot be asked: it does not support MCP elicitation".into(),
        ),
        Some(p) => match ask(p, request.question(), timeout).await {
            Ok(()) => Answer::Approved,
            Err(why) if why.starts_with("no answer") => Answer::TimedOut(timeout),
            Err(why) => Answer::Denied(why),
        },
    };
    d.settle(&answer)
}

fn can_ask(peer: &Peer<RoleServer>) -> bool {
    peer.peer_info()
        .is_some_and(|info| info.capabilities.elicitation.is_some())
}

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
    if !can_ask(peer) {
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
