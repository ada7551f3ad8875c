from astra_agent.cli import app

app()
