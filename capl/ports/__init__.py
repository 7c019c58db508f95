"""Ports: the Protocols and value types the controllers work against.

capl.kube and capl.virt implement them; tests may implement them in memory.
"""
