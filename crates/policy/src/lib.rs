//! agentrun policy
