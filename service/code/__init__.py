"""What a job runs: uploaded code packages (packages.py), the policy for code on the
server's disk and for runtime_env (user_code.py), and how an upload is
shown (upload_view.py)."""
