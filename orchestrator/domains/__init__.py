"""Domains: the worlds a tau2-style episode acts in.  folder.py: a domain folder (db.json,
tools.py, policy.md, tasks.json) loaded and its tools called (data_synthesis writes these
folders); upstream.py: ToolScale domains on upstream's own tau2 tools, from a ToolOrchestra
checkout; tau2_env.py: either one as a tau2 Environment (needs tau2); outcome.py: a solo
episode's verdict (tau2's evaluators, or the same comparison built in)."""
