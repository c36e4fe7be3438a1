//! agentrun image
