//! An `escalate` decision asked of the user: an MCP elicitation (`elicitation/create`, a form
//! with one boolean, `approve`) sent to the client of the call being served. Accepted with
//! `approve: true` allows; anything else (declined, cancelled, `approve: false`, no answer
//! within the approval timeout, a client without the elicitation capability) denies, with
//! the reason said in the result.
//!
//! Two things escalate: a connection (the session's egress proxy asks [`McpApprover`] while
//! it holds the connection, on its own thread) and a `write_file` to an `escalate_write`
//! path ([`settle`], before anything is written).
//!
//! One clock decides "no answer" (see `agentrun_policy::approval`): the proxy's approval wait
//! for a connection, [`settle`]'s for a write. The elicitation itself has no timeout; when the
//! clock runs out the question is withdrawn (`notifications/cancelled` to the client) and the
//! decision reads "needs approval: no answer within 60 s: ...", whichever path asked.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentrun_policy::{
    Action, Answer, Approval, ApprovalFuture, Approver, Decision, EscalationRequest,
};
use agentrun_pool::lock;
use rmcp::model::{
    CancelledNotificationParam, ClientResult, ElicitRequest, ElicitRequestParams,
    ElicitationAction, ElicitationSchema, ServerRequest,
};
use rmcp::service::{Peer, PeerRequestOptions, RoleServer};

/// The client of a session's latest call: who an escalation asks.
pub type PeerSlot = Arc<Mutex<Option<Peer<RoleServer>>>>;

/// The approver of a session's egress proxy: asks the session's client. The proxy polls
/// the answer on a plain thread and bounds the wait, so the elicitation runs on the server's
/// runtime, the future only waits for its result, and dropping the future (the proxy's bound
/// passed) withdraws the question.
pub struct McpApprover {
    pub peer: PeerSlot,
    pub runtime: tokio::runtime::Handle,
}

impl Approver for McpApprover {
    fn ask(&self, request: EscalationRequest) -> ApprovalFuture {
        let peer = lock(&self.peer).clone();
        let (mut tx, rx) = tokio::sync::oneshot::channel();
        self.runtime.spawn(async move {
            let answer = match peer {
                Some(p) => ask(&p, request.question(), tx.closed()).await,
                None => Some(Approval::Unavailable {
                    why: "there is no client to ask".into(),
                }),
            };
            // None: the proxy stopped waiting; it decides (and words) that.
            if let Some(a) = answer {
                let _ = tx.send(a);
            }
        });
        Box::pin(async move {
            rx.await.unwrap_or(Approval::Denied {
                why: "the server stopped before an answer came".into(),
            })
        })
    }
}

/// An escalate decision on `action` in sandbox `sandbox_id` asked of `peer` and settled
/// (approved, denied, or no answer within `timeout`: this function's clock is the only one).
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
        Some(p) => Answer::from_approval(
            ask(p, request.question(), tokio::time::sleep(timeout)).await,
            timeout,
        ),
    };
    d.settle(&answer)
}

fn can_ask(peer: &Peer<RoleServer>) -> bool {
    peer.peer_info()
        .is_some_and(|info| info.capabilities.elicitation.is_some())
}

/// Asks the user `message` until `stop` resolves: the answer, or `None` when `stop` came
/// first (the question is then withdrawn: `notifications/cancelled` for it goes to the
/// client). No timer of its own: whoever passes `stop` decides when nobody answered.
pub async fn ask(
    peer: &Peer<RoleServer>,
    message: String,
    stop: impl Future<Output = ()>,
) -> Option<Approval> {
    if !can_ask(peer) {
        return Some(Approval::Unavailable {
            why: "the client cannot be asked: it does not support MCP elicitation".into(),
        });
    }
    let schema = match ElicitationSchema::builder()
        .required_bool_property("approve", |b| {
            b.description("Allow it? (true: allow, false: deny)")
        })
        .build()
    {
        Ok(s) => s,
        Err(e) => {
            return Some(Approval::Unavailable {
                why: format!("the question could not be made: {e}"),
            })
        }
    };
    let params = ElicitRequestParams::FormElicitationParams {
        meta: None,
        message,
        requested_schema: schema,
    };
    let request = ServerRequest::ElicitRequest(ElicitRequest::new(params));
    let handle = match peer
        .send_request_with_option(request, PeerRequestOptions::no_options())
        .await
    {
        Ok(h) => h,
        Err(e) => {
            return Some(Approval::Unavailable {
                why: format!("the question could not be asked: {e}"),
            })
        }
    };
    let id = handle.id.clone();
    let response = tokio::select! {
        r = handle.await_response() => r,
        () = stop => {
            // The client may be gone; the question is over either way.
            let _ = peer
                .notify_cancelled(CancelledNotificationParam::new(
                    Some(id),
                    Some("no answer in time: the question is withdrawn".into()),
                ))
                .await;
            return None;
        }
    };
    Some(match response {
        Ok(ClientResult::ElicitResult(r)) => match r.action {
            ElicitationAction::Accept
                if r.content
                    .as_ref()
                    .and_then(|c| c.get("approve"))
                    .and_then(|v| v.as_bool())
                    == Some(true) =>
            {
                Approval::Approved
            }
            ElicitationAction::Accept => Approval::Denied {
                why: "the user answered no".into(),
            },
            ElicitationAction::Decline => Approval::Denied {
                why: "the user declined".into(),
            },
            _ => Approval::Denied {
                why: "the user cancelled the question".into(),
            },
        },
        Ok(_) => Approval::Unavailable {
            why: "the client answered the question with something else".into(),
        },
        Err(e) => Approval::Unavailable {
            why: format!("the question could not be asked: {e}"),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentrun_policy::{Approvals, EscalationOutcome};
    use rmcp::handler::client::ClientHandler;
    use rmcp::handler::server::ServerHandler;
    use rmcp::model::{
        ClientCapabilities, ClientConfig, ElicitResult, ElicitationCapability, Implementation,
        ProtocolVersion,
    };
    use rmcp::service::{NotificationContext, RequestContext, RoleClient, RunningService};
    use rmcp::{ErrorData, ServiceExt};
    use std::time::Instant;

    /// What the test client saw.
    #[derive(Default)]
    struct Seen {
        asked: Mutex<usize>,
        cancelled: Mutex<Vec<CancelledNotificationParam>>,
    }

    /// An MCP client that answers elicitations with `answer` (`None`: never answers).
    #[derive(Clone)]
    struct Client {
        answer: Option<ElicitResult>,
        elicitation: bool,
        seen: Arc<Seen>,
    }

    impl ClientHandler for Client {
        async fn create_elicitation(
            &self,
            _request: ElicitRequestParams,
            _context: RequestContext<RoleClient>,
        ) -> Result<ElicitResult, ErrorData> {
            *lock(&self.seen.asked) += 1;
            match &self.answer {
                Some(a) => Ok(a.clone()),
                None => std::future::pending().await,
            }
        }

        async fn on_cancelled(
            &self,
            params: CancelledNotificationParam,
            _context: NotificationContext<RoleClient>,
        ) {
            lock(&self.seen.cancelled).push(params);
        }

        fn get_info(&self) -> ClientConfig {
            let mut caps = ClientCapabilities::default();
            if self.elicitation {
                caps.elicitation = Some(ElicitationCapability::new());
            }
            let mut info = ClientConfig::new(caps, Implementation::new("test-client", "0"));
            info.protocol_version = ProtocolVersion::V_2025_06_18;
            info
        }
    }

    /// How many questions the client saw withdrawn, once one was (10 s at most).
    fn withdrawn(seen: &Seen) -> usize {
        let deadline = Instant::now() + Duration::from_secs(10);
        while lock(&seen.cancelled).is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        lock(&seen.cancelled).len()
    }

    #[derive(Clone)]
    struct Server;
    impl ServerHandler for Server {}

    /// The approver that asks `server`'s client.
    fn approver_of(
        rt: &tokio::runtime::Runtime,
        server: &RunningService<RoleServer, Server>,
    ) -> McpApprover {
        McpApprover {
            peer: Arc::new(Mutex::new(Some(server.peer().clone()))),
            runtime: rt.handle().clone(),
        }
    }

    /// A server and a connected client that sees every question and answers none.
    fn unanswering(
        rt: &tokio::runtime::Runtime,
    ) -> (
        Arc<Seen>,
        RunningService<RoleServer, Server>,
        RunningService<RoleClient, Client>,
    ) {
        let seen = Arc::new(Seen::default());
        let client = Client {
            answer: None,
            elicitation: true,
            seen: seen.clone(),
        };
        let (server, client) = connect(rt, client);
        (seen, server, client)
    }

    /// A server and a connected client (over an in-memory pipe) on `rt`.
    fn connect(
        rt: &tokio::runtime::Runtime,
        client: Client,
    ) -> (
        RunningService<RoleServer, Server>,
        RunningService<RoleClient, Client>,
    ) {
        rt.block_on(async {
            let (s, c) = tokio::io::duplex(64 * 1024);
            let server = tokio::spawn(async move { Server.serve(tokio::io::split(s)).await });
            let client = client.serve(tokio::io::split(c)).await.expect("client up");
            (server.await.unwrap().expect("server up"), client)
        })
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    }

    fn connect_decision() -> (Action, Decision) {
        (
            Action::Connect {
                host: "api.github.com".into(),
                port: 443,
            },
            Decision::escalate("network.escalate[0]", "connecting to api.github.com:443"),
        )
    }

    /// Nobody answers: the proxy's wait (its bound, on its own thread, as the egress proxy
    /// does) decides, in the one wording, however long the question had been open; the
    /// question is then withdrawn. The approver has no clock of its own: held past the bound
    /// by a caller that waits longer, it still has not answered.
    #[test]
    fn an_unanswered_question_is_decided_by_the_callers_bound_alone() {
        let rt = runtime();
        let (seen, server, _client) = unanswering(&rt);
        let approver = approver_of(&rt, &server);
        let (action, d) = connect_decision();
        let bound = Duration::from_millis(300);
        let t = Instant::now();
        let settled =
            Approvals::new().settle_blocking(Some(&approver), "ar-1", &action, d.clone(), bound);
        assert!(t.elapsed() >= bound, "{:?}", t.elapsed());
        assert!(!settled.allow);
        assert_eq!(settled.escalation, Some(EscalationOutcome::Timeout));
        assert_eq!(
            settled.reason,
            "needs approval: no answer within 300 ms: connecting to api.github.com:443 is allowed only when a person approves it"
        );
        assert_eq!(withdrawn(&seen), 1, "the question was withdrawn");

        // A caller that waits 3 s: no answer from the approver at 300 ms or ever before.
        let request = EscalationRequest::new("ar-1", &action, &d);
        let waited =
            agentrun_policy::ask_blocking(Some(&approver), request, Duration::from_millis(1500));
        assert_eq!(
            waited,
            Answer::TimedOut(Duration::from_millis(1500)),
            "only the caller's bound decides"
        );
        assert_eq!(*lock(&seen.asked), 2);
    }

    /// A write's question (no proxy: [`settle`]'s own bound) says it the same way.
    #[test]
    fn an_unanswered_write_says_it_in_the_same_words() {
        let rt = runtime();
        let (seen, server, _client) = unanswering(&rt);
        let action = Action::Write("/etc/app/x".into());
        let d = Decision::escalate("filesystem.escalate_write[0]", "writing /etc/app/x");
        let settled = rt.block_on(settle(
            Some(server.peer()),
            "ar-1",
            &action,
            d,
            Duration::from_millis(300),
        ));
        assert_eq!(settled.escalation, Some(EscalationOutcome::Timeout));
        assert!(
            settled
                .reason
                .starts_with("needs approval: no answer within 300 ms: writing /etc/app/x"),
            "{}",
            settled.reason
        );
        assert_eq!(withdrawn(&seen), 1, "the question was withdrawn");
    }

    /// Answered: yes allows, no denies saying so; a client that cannot be asked is "no
    /// approver", through the proxy as through a write.
    #[test]
    fn answers_and_clients_that_cannot_be_asked() {
        let rt = runtime();
        let (action, d) = connect_decision();
        let bound = Duration::from_secs(10);
        for (answer, elicitation, outcome, reason) in [
            (
                Some(
                    ElicitResult::new(ElicitationAction::Accept)
                        .with_content(serde_json::json!({"approve": true})),
                ),
                true,
                EscalationOutcome::Approved,
                "approved by a person: connecting to",
            ),
            (
                Some(ElicitResult::new(ElicitationAction::Decline)),
                true,
                EscalationOutcome::Denied,
                "not approved (the user declined): connecting to",
            ),
            (
                None,
                false,
                EscalationOutcome::NoApprover,
                "needs approval (the client cannot be asked: it does not support MCP elicitation): connecting to",
            ),
        ] {
            let (server, _client) = connect(
                &rt,
                Client {
                    answer,
                    elicitation,
                    seen: Arc::default(),
                },
            );
            let approver = approver_of(&rt, &server);
            let proxied =
                Approvals::new().settle_blocking(Some(&approver), "ar-1", &action, d.clone(), bound);
            let written = rt.block_on(settle(Some(server.peer()), "ar-1", &action, d.clone(), bound));
            for s in [&proxied, &written] {
                assert_eq!(s.escalation, Some(outcome), "{s:?}");
                assert!(s.reason.starts_with(reason), "{s:?}");
            }
        }
    }
}
