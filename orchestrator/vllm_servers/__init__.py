"""Starting vLLM servers and listing them in the endpoints file the gateway reads.
launch.py: one server (`python -m orchestrator.vllm_servers.launch`: health wait, registration,
unregistration on exit); experts.py: every vLLM model of a settings profile on one node
(`python -m orchestrator.vllm_servers.experts`, slurm/serve_experts.sbatch), one launch.py
process per server."""
