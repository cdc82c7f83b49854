"""Every lab executed under every GPU profile on a machine without one: a vLLM stand-in, stand-ins at the other
boundaries a GPU run crosses, and a runner (``python -m ci.rehearse --profile h100``)."""
