from stateward.cli.main import main

raise SystemExit(main())
