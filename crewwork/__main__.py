from crewwork.cli import run

run()
