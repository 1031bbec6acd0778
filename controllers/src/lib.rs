//! Multi-cluster runtime and reconcilers (grows with the controller issues).
