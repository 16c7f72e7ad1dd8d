"""An arbiter: rules disputed claims on evidence by re-executing the task in the sandbox.

Any party can run one; a deal names it. See docs/settlement.md ("Disputes").
"""
