"""`argosy agent`: one per node (a DaemonSet), holding the node's copies of the ModelCaches that
select it."""
